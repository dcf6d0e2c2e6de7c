//! The CUDA driver API, opened at run time from `libcuda.so.1`.
//!
//! Only the entry points poot uses are loaded; a missing library or symbol is a typed
//! [`CudaError::Unavailable`] naming it, never a panic or a link failure, so the crate builds
//! and runs where no driver is installed. Every call's `CUresult` is checked and turned into
//! [`CudaError::Driver`] with the driver's own name for it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::Path;

use libloading::Library;

use crate::error::CudaError;

pub type CuResult = c_int;
pub type CuDevice = c_int;
pub type CuContext = *mut c_void;
pub type CuStream = *mut c_void;
pub type CuEvent = *mut c_void;
pub type CuModule = *mut c_void;
pub type CuFunction = *mut c_void;
pub type CuDevicePtr = u64;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
pub const ATTR_CC_MAJOR: c_int = 75;
pub const ATTR_CC_MINOR: c_int = 76;
pub const STREAM_NON_BLOCKING: c_uint = 1;
pub const EVENT_DISABLE_TIMING: c_uint = 2;
pub const FUNC_ATTR_LOCAL_SIZE_BYTES: c_int = 3;
pub const FUNC_ATTR_NUM_REGS: c_int = 4;

macro_rules! driver_api {
    ($($field:ident = $sym:literal : fn($($arg:ty),*);)*) => {
        /// Entry points of the driver, resolved once.
        pub struct Driver {
            $(pub $field: unsafe extern "C" fn($($arg),*) -> CuResult,)*
            _lib: Library,
        }

        impl Driver {
            fn resolve(lib: Library) -> Result<Self, CudaError> {
                // SAFETY: each symbol is a function of the CUDA driver API with exactly the C
                // signature declared here (cuda.h, for the `_v2` names the header maps to);
                // the pointers stay valid because `_lib` keeps the library loaded.
                unsafe {
                    Ok(Self {
                        $($field: *lib
                            .get::<unsafe extern "C" fn($($arg),*) -> CuResult>($sym)
                            .map_err(|e| CudaError::Unavailable {
                                what: format!(
                                    "symbol {} in libcuda.so.1 ({e})",
                                    String::from_utf8_lossy(&$sym[..$sym.len() - 1])
                                ),
                            })?,)*
                        _lib: lib,
                    })
                }
            }
        }
    };
}

driver_api! {
    init = b"cuInit\0": fn(c_uint);
    driver_get_version = b"cuDriverGetVersion\0": fn(*mut c_int);
    device_get_count = b"cuDeviceGetCount\0": fn(*mut c_int);
    device_get = b"cuDeviceGet\0": fn(*mut CuDevice, c_int);
    device_get_name = b"cuDeviceGetName\0": fn(*mut c_char, c_int, CuDevice);
    device_get_attribute = b"cuDeviceGetAttribute\0": fn(*mut c_int, c_int, CuDevice);
    device_total_mem = b"cuDeviceTotalMem_v2\0": fn(*mut usize, CuDevice);
    primary_ctx_retain = b"cuDevicePrimaryCtxRetain\0": fn(*mut CuContext, CuDevice);
    primary_ctx_release = b"cuDevicePrimaryCtxRelease_v2\0": fn(CuDevice);
    ctx_set_current = b"cuCtxSetCurrent\0": fn(CuContext);
    stream_create = b"cuStreamCreate\0": fn(*mut CuStream, c_uint);
    stream_destroy = b"cuStreamDestroy_v2\0": fn(CuStream);
    event_create = b"cuEventCreate\0": fn(*mut CuEvent, c_uint);
    event_record = b"cuEventRecord\0": fn(CuEvent, CuStream);
    event_query = b"cuEventQuery\0": fn(CuEvent);
    event_elapsed = b"cuEventElapsedTime\0": fn(*mut f32, CuEvent, CuEvent);
    event_destroy = b"cuEventDestroy_v2\0": fn(CuEvent);
    mem_alloc = b"cuMemAlloc_v2\0": fn(*mut CuDevicePtr, usize);
    mem_free = b"cuMemFree_v2\0": fn(CuDevicePtr);
    mem_get_info = b"cuMemGetInfo_v2\0": fn(*mut usize, *mut usize);
    mem_host_alloc = b"cuMemHostAlloc\0": fn(*mut *mut c_void, usize, c_uint);
    mem_free_host = b"cuMemFreeHost\0": fn(*mut c_void);
    memcpy_htod_async = b"cuMemcpyHtoDAsync_v2\0": fn(CuDevicePtr, *const c_void, usize, CuStream);
    memcpy_dtoh_async = b"cuMemcpyDtoHAsync_v2\0": fn(*mut c_void, CuDevicePtr, usize, CuStream);
    memset_d8_async = b"cuMemsetD8Async\0": fn(CuDevicePtr, u8, usize, CuStream);
    module_load_data = b"cuModuleLoadData\0": fn(*mut CuModule, *const c_void);
    module_get_function = b"cuModuleGetFunction\0": fn(*mut CuFunction, CuModule, *const c_char);
    module_unload = b"cuModuleUnload\0": fn(CuModule);
    func_get_attribute = b"cuFuncGetAttribute\0": fn(*mut c_int, c_int, CuFunction);
    launch_kernel = b"cuLaunchKernel\0": fn(
        CuFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CuStream,
        *mut *mut c_void, *mut *mut c_void
    );
    get_error_name = b"cuGetErrorName\0": fn(CuResult, *mut *const c_char);
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

impl Driver {
    /// Opens `libcuda.so.1` (or `path`: the CPU emulation in tests) and resolves every entry
    /// point, then `cuInit(0)`.
    pub fn open(path: Option<&Path>) -> Result<Self, CudaError> {
        let name = path.map_or("libcuda.so.1".into(), |p| p.display().to_string());
        // SAFETY: loading the NVIDIA driver library runs its initializers, which have no
        // preconditions on our side; nothing else is called until the symbols are resolved.
        let lib = unsafe { Library::new(&name) }.map_err(|e| CudaError::Unavailable {
            what: format!("the NVIDIA driver library {name} ({e})"),
        })?;
        let d = Self::resolve(lib)?;
        // SAFETY: cuInit takes a flags word that must be 0.
        d.check("cuInit", unsafe { (d.init)(0) })?;
        Ok(d)
    }

    /// `Ok` for `CUDA_SUCCESS`, else the typed error naming `call` and the driver's code.
    pub fn check(&self, call: &'static str, r: CuResult) -> Result<(), CudaError> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        Err(CudaError::Driver {
            call,
            code: r,
            name: self.error_name(r),
        })
    }

    /// The driver's name for a result code (`CUDA_ERROR_ILLEGAL_ADDRESS`, ...).
    pub fn error_name(&self, r: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string (or fails for an unknown
        // code and leaves it null, which is checked).
        let ok = unsafe { (self.get_error_name)(r, &mut p) } == CUDA_SUCCESS;
        if ok && !p.is_null() {
            // SAFETY: a non-null result is a NUL-terminated static string owned by the driver.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            format!("CUresult {r}")
        }
    }
}
