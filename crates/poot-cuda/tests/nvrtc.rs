//! Every kernel source compiles with NVRTC, with the runtime's options, for the architectures
//! poot targets (sm_80: A100, sm_90: H100/H200), to cubins and to PTX. Needs NVRTC, not a
//! GPU (PyPI's nvidia-cuda-nvrtc-cu12 is enough: put its lib folder on LD_LIBRARY_PATH, as
//! `make ptx-check` does); skips with the reason where NVRTC is absent, fails under
//! `POOT_REQUIRE_CUDA=1`.
use poot_cuda::{compile_kernels, ops, CudaError, Target};

fn nvrtc_here() -> bool {
    match poot_cuda::nvrtc_version() {
        Ok(v) => {
            eprintln!("NVRTC {}.{}", v.0, v.1);
            true
        }
        Err(e) => {
            if std::env::var("POOT_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("POOT_REQUIRE_CUDA=1 but {e}");
            }
            eprintln!("SKIP: {e}");
            false
        }
    }
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    if !nvrtc_here() {
        return;
    }
    for arch in [80, 90] {
        let cubins = compile_kernels(Target::Cubin(arch)).unwrap();
        assert_eq!(cubins.len(), ops::SOURCES.len());
        for (file, image) in &cubins {
            assert_eq!(
                &image[..4],
                b"\x7fELF",
                "{file} for sm_{arch} is not an ELF cubin"
            );
        }
        for (file, ptx) in compile_kernels(Target::Ptx(arch)).unwrap() {
            let text = String::from_utf8_lossy(&ptx);
            assert!(text.contains(&format!(".target sm_{arch}")), "{file}");
            let source = ops::SOURCES.iter().find(|(f, _)| *f == file).unwrap().1;
            for k in ops::kernel_names(source) {
                assert!(
                    text.contains(&format!(".entry {k}(")),
                    "{file}: no entry {k} in the PTX"
                );
            }
        }
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_a_typed_error_with_the_log() {
    if !nvrtc_here() {
        return;
    }
    // The same entry point the runtime uses, on a broken source.
    let err = poot_cuda::compile_source(
        "broken.cu",
        "extern \"C\" __global__ void k() { nope; }",
        Target::Ptx(80),
    )
    .unwrap_err();
    match err {
        CudaError::Compile { source_name, log } => {
            assert_eq!(source_name, "broken.cu");
            assert!(log.contains("nope"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
