//! `ArrayWeights`: a weight store over host arrays that Python owns (numpy arrays, or torch
//! tensors' memory seen through numpy), for graphs lowered from a `torch.nn.Module`.
//!
//! Invariants: no tensor data is copied; each tensor is held through a buffer export
//! (`PyBuffer`), which keeps the exporter's memory alive and its size fixed for as long as a
//! graph, plan or `Weights` holds the store. The bytes are read without the GIL, so the caller
//! promises not to write them while a run reads them (a `torch.nn.Module` compiled by
//! `poot.compile` is treated as frozen: changing its parameters afterwards needs a new compile).
//! Only C-contiguous arrays are taken; dtypes are F32, F16 and BF16 (BF16 handed over as 16-bit
//! integer words with an explicit dtype, since numpy has no bfloat16).

use std::collections::HashMap;

use poot_core::DType;
use poot_graph::WeightCatalog;
use poot_runtime::WeightStore;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

struct ArrayTensor {
    dtype: DType,
    shape: Vec<usize>,
    buf: PyBuffer<u8>,
}

/// Stored tensors over Python-owned arrays (see the module docs).
pub(crate) struct ArrayWeights {
    tensors: HashMap<String, ArrayTensor>,
}

impl WeightCatalog for ArrayWeights {
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let t = self.tensors.get(name)?;
        Some((t.dtype, t.shape.clone()))
    }
}

impl WeightStore for ArrayWeights {
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensors.get(name)?;
        let (ptr, len) = (t.buf.buf_ptr() as *const u8, t.buf.len_bytes());
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: `buf` holds a C-contiguous export of `len` bytes at `ptr` (checked in
        // `from_arrays`); the export keeps the memory alive and unresized until `buf` drops,
        // which is after `self` (and so the returned borrow) is gone. Writes by the owner
        // during a run are excluded by the contract in the module docs.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    fn total_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| t.buf.len_bytes() as u64)
            .sum()
    }
}

fn dtype_of(numpy_dtype: &str, given: Option<&str>) -> Option<DType> {
    match (numpy_dtype, given) {
        ("float32", None | Some("f32" | "F32")) => Some(DType::F32),
        ("float16", None | Some("f16" | "F16")) => Some(DType::F16),
        ("uint16" | "int16", Some("bf16" | "BF16")) => Some(DType::BF16),
        _ => None,
    }
}

impl ArrayWeights {
    /// The store over `arrays` (name -> array), `dtypes` overriding a name's dtype ("bf16").
    pub(crate) fn from_arrays(
        arrays: &Bound<'_, PyDict>,
        dtypes: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut tensors = HashMap::with_capacity(arrays.len());
        for (key, arr) in arrays.iter() {
            let name: String = key.extract()?;
            let given: Option<String> = match dtypes {
                Some(d) => d.get_item(&name)?.map(|v| v.extract()).transpose()?,
                None => None,
            };
            let np_dtype: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
            let dtype = dtype_of(&np_dtype, given.as_deref()).ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "Weights.from_arrays: {name:?} has dtype {np_dtype} (given {given:?}); \
                     float32, float16, or 16-bit words with dtype \"bf16\" are stored"
                ))
            })?;
            let contiguous: bool = arr.getattr("flags")?.get_item("C_CONTIGUOUS")?.extract()?;
            if !contiguous {
                return Err(PyValueError::new_err(format!(
                    "Weights.from_arrays: {name:?} is not C-contiguous (copy it first)"
                )));
            }
            let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
            // A flat byte view of the same memory (numpy makes no copy of a contiguous array).
            let bytes = arr
                .call_method1("reshape", (-1,))?
                .call_method1("view", ("uint8",))?;
            let buf = PyBuffer::<u8>::get(&bytes)?;
            let n = shape.iter().product::<usize>() as u64;
            let want = dtype.bytes_for(n).unwrap_or(u64::MAX) as usize;
            if !buf.is_c_contiguous() || buf.len_bytes() != want {
                return Err(PyValueError::new_err(format!(
                    "Weights.from_arrays: {name:?} exports {} bytes, not {want}",
                    buf.len_bytes()
                )));
            }
            tensors.insert(name, ArrayTensor { dtype, shape, buf });
        }
        Ok(ArrayWeights { tensors })
    }
}
