//! Writes every kernel's PTX, compiled by NVRTC with the runtime's options, for the given
//! architectures: `cargo run -p poot-cuda --example ptx -- OUT_DIR 80 90` writes
//! `OUT_DIR/<source>.sm_<arch>.ptx`. `scripts/ptx_check.sh` then assembles each with `ptxas`.
use std::path::PathBuf;

use poot_cuda::{compile_kernels, Target};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: ptx OUT_DIR ARCH...")?);
    std::fs::create_dir_all(&out)?;
    for arch in args {
        let arch: u32 = arch.parse()?;
        for (file, ptx) in compile_kernels(Target::Ptx(arch))? {
            let text = ptx.strip_suffix(&[0]).unwrap_or(&ptx);
            let path = out.join(format!("{}.sm_{arch}.ptx", file.trim_end_matches(".cu")));
            std::fs::write(&path, text)?;
            println!("{}", path.display());
        }
    }
    Ok(())
}
