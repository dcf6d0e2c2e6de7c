//! The CPU path for the kernels: the same `shaders/cuda` sources built by the host C++
//! compiler against `cpu_shim.h` (CUDA threads as fibers, barriers and warp shuffles
//! modelled; see that header) into a shared library, and launched from the same [`Launch`]
//! descriptions the GPU gets. This is how the ordinary test suite checks each kernel's
//! numerics without a GPU: not a hand-kept twin, the kernel itself.
//!
//! The compiler is `$CXX` or `c++`, with `-ffp-contract=off` so products and sums round as
//! written (NVRTC runs with `--fmad=false` for the same reason). Building takes a few seconds
//! and happens once per process ([`Shim::get`]). Launches are serialized: the shim's block
//! state is global.
//!
//! The same library exports a CPU emulation of the driver API and NVRTC (`emu/driver.cpp`,
//! [`Shim::library`]): `CudaRuntime` opened on it runs its whole host side (plans, staging,
//! launches, bounded waits, poisoning) with the shim as the device, which is how the device
//! suite runs in the ordinary tests where no GPU exists. It proves the host code and the
//! kernels' numerics, not anything about a GPU.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use libloading::Library;

use crate::ops::{self, Launch, Params};

type Launcher = unsafe extern "C" fn(u32, u32, u32, u32, u32, u32, *mut *mut std::ffi::c_void);

#[derive(Debug)]
pub struct Shim {
    lib: Mutex<Library>,
    path: PathBuf,
}

/// The CPU emulation of the driver API and NVRTC (see emu/driver.cpp), built into the shim.
const EMULATED_DRIVER: &str = include_str!("../emu/driver.cpp");

/// The C++ translation unit: the shim header, every shim source, and one `extern "C"`
/// launcher per kernel that unpacks `void**` arguments by the kernel's own parameter types.
fn translation_unit() -> String {
    let mut s = String::from("#include \"cpu_shim.h\"\n#include <utility>\n");
    for f in ops::SHIM_SOURCES {
        s += &format!("#include \"{f}\"\n");
    }
    s += r#"
template <class... A, std::size_t... I>
static void poot_call(void (*f)(A...), void** p, std::index_sequence<I...>) {
    f(*static_cast<A*>(p[I])...);
}
template <class... A>
static void poot_run(void (*f)(A...), dim3 g, dim3 b, void** p) {
    struct Env { void (*f)(A...); void** p; } env{f, p};
    poot_shim::launch(g, b, [](void* e) {
        Env* v = static_cast<Env*>(e);
        poot_call(v->f, v->p, std::index_sequence_for<A...>{});
    }, &env);
}
"#;
    let mut table = String::new();
    for (file, text) in ops::SOURCES {
        if !ops::SHIM_SOURCES.contains(file) {
            continue;
        }
        for k in ops::kernel_names(text) {
            s += &format!(
                "extern \"C\" void poot_launch_{k}(unsigned gx, unsigned gy, unsigned gz, \
                 unsigned bx, unsigned by, unsigned bz, void** p) {{ \
                 poot_run({k}, dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, p); }}\n"
            );
            table += &format!("    {{\"{k}\", poot_launch_{k}}},\n");
        }
    }
    // The emulated driver (emu/driver.cpp) finds kernels by name in this table.
    s += "struct PootKernel { const char* name; void (*launch)(unsigned, unsigned, unsigned, \
          unsigned, unsigned, unsigned, void**); };\n\
          extern \"C\" const PootKernel poot_kernels[] = {\n";
    s += &table;
    s += "    {nullptr, nullptr},\n};\n";
    s
}

impl Shim {
    /// Writes the sources into `dir` and builds `libpoot_cuda_shim.so` there, unless a
    /// library built from the same sources is already there (the name carries their hash).
    pub fn build(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let tu = translation_unit();
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            &tu,
            ops::COMMON,
            ops::CPU_SHIM,
            ops::SOURCES,
            EMULATED_DRIVER,
            &cxx,
        )
            .hash(&mut h);
        let lib = dir.join(format!("libpoot_cuda_shim-{:016x}.so", h.finish()));
        if !lib.exists() {
            // Each builder works in its own folder and renames the result into place, so
            // test processes building at once never load a half-written library.
            let work = dir.join(format!("build-{}", std::process::id()));
            std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
            let write = |name: &str, text: &str| {
                std::fs::write(work.join(name), text).map_err(|e| format!("{name}: {e}"))
            };
            write(ops::COMMON.0, ops::COMMON.1)?;
            write(ops::CPU_SHIM.0, ops::CPU_SHIM.1)?;
            for (name, text) in ops::SOURCES {
                write(name, text)?;
            }
            write("shim.cpp", &tu)?;
            write("driver.cpp", EMULATED_DRIVER)?;
            let built = work.join("libpoot_cuda_shim.so");
            // -U_FORTIFY_SOURCE: fortified longjmp rejects jumps between fiber stacks.
            let out = Command::new(&cxx)
                .args([
                    "-std=c++17",
                    "-O2",
                    "-ffp-contract=off",
                    "-fPIC",
                    "-shared",
                    "-w",
                ])
                .args(["-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0"])
                .arg("-I")
                .arg(&work)
                .arg("-o")
                .arg(&built)
                .arg(work.join("shim.cpp"))
                .arg(work.join("driver.cpp"))
                .output()
                .map_err(|e| format!("running {cxx}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "{cxx} failed on the CUDA sources:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            std::fs::rename(&built, &lib).map_err(|e| format!("{}: {e}", lib.display()))?;
            let _ = std::fs::remove_dir_all(&work);
        }
        // SAFETY: the library was built from the shim sources; loading runs no code of ours
        // beyond static initializers of plain globals.
        let handle = unsafe { Library::new(&lib) }.map_err(|e| format!("loading the shim: {e}"))?;
        Ok(Self {
            lib: Mutex::new(handle),
            path: lib,
        })
    }

    /// The process's shim, built once (and reused across processes) under the temp folder;
    /// `Err` (with the reason) where no C++ compiler works.
    pub fn get() -> Result<&'static Shim, String> {
        static SHIM: OnceLock<Result<Shim, String>> = OnceLock::new();
        SHIM.get_or_init(|| Self::build(&std::env::temp_dir().join("poot-cuda-shim")))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The shim library, which also exports the emulated driver API and NVRTC: give it as
    /// `CudaOptions::driver_library` and `nvrtc_library` to run the runtime on the CPU.
    pub fn library(&self) -> &Path {
        &self.path
    }

    /// Runs `l` on the CPU.
    ///
    /// # Safety
    /// Every `Arg::Ptr` of `l` must be a host address valid for everything the kernel reads
    /// and writes at the launch's shapes (the same contract a device launch has).
    pub unsafe fn launch(&self, l: &Launch) -> Result<(), String> {
        let lib = self.lib.lock().unwrap_or_else(|e| e.into_inner());
        let sym = format!("poot_launch_{}\0", l.kernel);
        // SAFETY: the symbol was generated by `translation_unit` with the `Launcher` type.
        let f = unsafe { lib.get::<Launcher>(sym.as_bytes()) }
            .map_err(|e| format!("{} is not in the shim: {e}", l.kernel))?;
        let mut p = Params::new(&l.args);
        let [gx, gy, gz] = l.grid;
        let [bx, by, bz] = l.block;
        // SAFETY: `p` holds one value per kernel parameter in the kernel's order (the launch
        // builders in `ops` mirror each signature); pointer validity is the caller's contract.
        unsafe { f(gx, gy, gz, bx, by, bz, p.as_ptr()) };
        Ok(())
    }
}
