//! NVRTC, opened at run time: compiles `shaders/cuda/*.cu` to a cubin for the device's own
//! architecture (`sm_XY` from its compute capability), so the wheel carries sources only and
//! builds without a CUDA toolkit.
//!
//! Options fixed for every kernel: `--fmad=false` (each product and sum rounds as written,
//! which is what the CPU shim executes, so both paths share an order and rounding), default
//! IEEE division and square root, `-std=c++17`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

use libloading::Library;

use crate::error::CudaError;

type Prog = *mut c_void;
type R = c_int;

/// Where NVRTC is looked for, in order: the loader's path (LD_LIBRARY_PATH, ldconfig), then
/// the usual toolkit locations.
const CANDIDATES: &[&str] = &[
    "libnvrtc.so",
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "/usr/local/cuda/lib64/libnvrtc.so",
    "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so",
];

/// What NVRTC produces: a cubin for `sm_XY`, or PTX for `compute_XY` (what `ptxas` checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Cubin(u32),
    Ptx(u32),
}

pub struct Nvrtc {
    version: (i32, i32),
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> R,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> R,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> R,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> R,
    cubin_size: unsafe extern "C" fn(Prog, *mut usize) -> R,
    cubin: unsafe extern "C" fn(Prog, *mut c_char) -> R,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> R,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> R,
    destroy: unsafe extern "C" fn(*mut Prog) -> R,
    _lib: Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

fn unavailable(what: String) -> CudaError {
    CudaError::Unavailable { what }
}

impl Nvrtc {
    /// Opens NVRTC from `path`, or else the first of `CANDIDATES` that loads.
    pub fn open(path: Option<&Path>) -> Result<Self, CudaError> {
        let mut tried = Vec::new();
        let given = path.map(|p| p.display().to_string());
        let names: Vec<&str> = match &given {
            Some(p) => vec![p.as_str()],
            None => CANDIDATES.to_vec(),
        };
        for name in names {
            // SAFETY: loading NVRTC runs its initializers, which have no preconditions.
            match unsafe { Library::new(name) } {
                Ok(lib) => return Self::resolve(lib),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(unavailable(format!(
            "NVRTC (libnvrtc.so; tried {})",
            tried.join("; ")
        )))
    }

    fn resolve(lib: Library) -> Result<Self, CudaError> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the NVRTC entry point of that name and the field it is
                // stored in has its C signature (nvrtc.h); `_lib` keeps it loaded.
                *unsafe { lib.get($name) }.map_err(|e| {
                    unavailable(format!(
                        "symbol {} in NVRTC ({e})",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    ))
                })?
            };
        }
        let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> R = sym!(b"nvrtcVersion\0");
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion writes two ints.
        unsafe { version_fn(&mut major, &mut minor) };
        Ok(Self {
            version: (major, minor),
            create: sym!(b"nvrtcCreateProgram\0"),
            compile: sym!(b"nvrtcCompileProgram\0"),
            log_size: sym!(b"nvrtcGetProgramLogSize\0"),
            log: sym!(b"nvrtcGetProgramLog\0"),
            cubin_size: sym!(b"nvrtcGetCUBINSize\0"),
            cubin: sym!(b"nvrtcGetCUBIN\0"),
            ptx_size: sym!(b"nvrtcGetPTXSize\0"),
            ptx: sym!(b"nvrtcGetPTX\0"),
            destroy: sym!(b"nvrtcDestroyProgram\0"),
            _lib: lib,
        })
    }

    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Compiles `source` (with `headers` as `(include name, contents)`) to `target`.
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        target: Target,
    ) -> Result<Vec<u8>, CudaError> {
        let c = |s: &str| CString::new(s).expect("kernel sources and names hold no NUL");
        let (src, cname) = (c(source), c(name));
        let hdr_src: Vec<CString> = headers.iter().map(|(_, s)| c(s)).collect();
        let hdr_name: Vec<CString> = headers.iter().map(|(n, _)| c(n)).collect();
        let hdr_src_p: Vec<*const c_char> = hdr_src.iter().map(|s| s.as_ptr()).collect();
        let hdr_name_p: Vec<*const c_char> = hdr_name.iter().map(|s| s.as_ptr()).collect();
        let opts: Vec<CString> = [
            match target {
                Target::Cubin(arch) => format!("--gpu-architecture=sm_{arch}"),
                Target::Ptx(arch) => format!("--gpu-architecture=compute_{arch}"),
            },
            "--fmad=false".into(),
            "-std=c++17".into(),
        ]
        .iter()
        .map(|s| c(s))
        .collect();
        let opts_p: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
        let fail = |what: &str, r: R| CudaError::Compile {
            source_name: name.to_owned(),
            log: format!("{what} returned {r}"),
        };
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string; the header arrays have
        // `headers.len()` entries each.
        let r = unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                headers.len() as c_int,
                hdr_src_p.as_ptr(),
                hdr_name_p.as_ptr(),
            )
        };
        if r != 0 {
            return Err(fail("nvrtcCreateProgram", r));
        }
        // SAFETY: `prog` was created above; `opts_p` holds `opts_p.len()` live strings.
        let r = unsafe { (self.compile)(prog, opts_p.len() as c_int, opts_p.as_ptr()) };
        let out = if r != 0 {
            Err(CudaError::Compile {
                source_name: name.to_owned(),
                log: self.program_log(prog),
            })
        } else {
            match target {
                Target::Cubin(_) => self.program_image(prog, self.cubin_size, self.cubin),
                Target::Ptx(_) => self.program_image(prog, self.ptx_size, self.ptx),
            }
            .ok_or_else(|| fail("nvrtcGetCUBIN/PTX", -1))
        };
        // SAFETY: destroys the program created above, once.
        unsafe { (self.destroy)(&mut prog) };
        out
    }

    fn program_log(&self, prog: Prog) -> String {
        let mut n = 0usize;
        // SAFETY: `prog` is live; the size call writes one usize.
        if unsafe { (self.log_size)(prog, &mut n) } != 0 || n == 0 {
            return "(no log)".into();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: the buffer holds the `n` bytes NVRTC reported for the log.
        unsafe { (self.log)(prog, buf.as_mut_ptr().cast()) };
        CStr::from_bytes_until_nul(&buf)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The compiled image (cubin, or PTX text with its NUL) through a size/get pair.
    fn program_image(
        &self,
        prog: Prog,
        size: unsafe extern "C" fn(Prog, *mut usize) -> R,
        get: unsafe extern "C" fn(Prog, *mut c_char) -> R,
    ) -> Option<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: `prog` is live and compiled; the size call writes one usize.
        if unsafe { size(prog, &mut n) } != 0 || n == 0 {
            return None;
        }
        let mut buf = vec![0u8; n];
        // SAFETY: the buffer holds the `n` bytes NVRTC reported for the image.
        (unsafe { get(prog, buf.as_mut_ptr().cast()) } == 0).then_some(buf)
    }
}
