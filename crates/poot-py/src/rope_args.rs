//! Parsing of tracer arguments given as Python strings and dicts: `Tracer.rope`'s `scaling`
//! dict into a `RopeScaling`, and the op kinds of the general tensor ops.

use poot_graph::{BinaryKind, RopeScaling, RopeStyle, MAX_ROPE_FACTORS};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::trace_error_kind;

fn dict_f32(d: &Bound<'_, PyDict>, key: &str, default: Option<f32>) -> PyResult<f32> {
    match d.get_item(key)? {
        Some(v) => v.extract(),
        None => default.ok_or_else(|| {
            pyo3::exceptions::PyKeyError::new_err(format!("rope scaling needs {key:?}"))
        }),
    }
}

pub(crate) fn parse_scaling(
    py: Python<'_>,
    scaling: Option<&Bound<'_, PyDict>>,
) -> PyResult<RopeScaling> {
    let Some(d) = scaling else {
        return Ok(RopeScaling::None);
    };
    let kind: String = match d.get_item("type")? {
        Some(v) => v.extract()?,
        None => "none".to_owned(),
    };
    let bad = |message: String| trace_error_kind(py, "shape", Some("rope"), None, message);
    let wrap = |e: PyErr| bad(format!("rope scaling {kind:?}: {e}"));
    match kind.as_str() {
        "none" | "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: dict_f32(d, "factor", None).map_err(wrap)?,
        }),
        "llama3" => {
            let orig = match d.get_item("original_max_position")? {
                Some(v) => Some(v),
                None => d.get_item("original_max_position_embeddings")?,
            };
            let original_max_position: u32 = match orig {
                Some(v) => v.extract().map_err(wrap)?,
                None => {
                    return Err(bad(
                        "rope scaling \"llama3\" needs original_max_position".into()
                    ))
                }
            };
            Ok(RopeScaling::Llama3 {
                factor: dict_f32(d, "factor", None).map_err(wrap)?,
                low_freq_factor: dict_f32(d, "low_freq_factor", Some(1.0)).map_err(wrap)?,
                high_freq_factor: dict_f32(d, "high_freq_factor", Some(4.0)).map_err(wrap)?,
                original_max_position,
            })
        }
        "factors" => {
            let given: Vec<f32> = match d.get_item("factors")? {
                Some(v) => v.extract().map_err(wrap)?,
                None => return Err(bad("rope scaling \"factors\" needs factors".into())),
            };
            if given.len() > MAX_ROPE_FACTORS {
                return Err(bad(format!(
                    "rope scaling \"factors\": {} factors, at most {MAX_ROPE_FACTORS}",
                    given.len()
                )));
            }
            let mut factors = [1.0f32; MAX_ROPE_FACTORS];
            factors[..given.len()].copy_from_slice(&given);
            Ok(RopeScaling::Factors {
                factors,
                attn_factor: dict_f32(d, "attn_factor", Some(1.0)).map_err(wrap)?,
            })
        }
        other => Err(bad(format!(
            "rope scaling type {other:?} is not supported (none, linear, llama3, factors)"
        ))),
    }
}

pub(crate) fn bad_kind(py: Python<'_>, op: &str, kind: &str) -> PyErr {
    trace_error_kind(
        py,
        "shape",
        None,
        None,
        format!("{op}: unknown kind {kind:?}"),
    )
}

pub(crate) fn binary_kind(py: Python<'_>, op: &str, kind: &str) -> PyResult<BinaryKind> {
    BinaryKind::ALL
        .into_iter()
        .find(|k| k.binary_name().strip_prefix("binary_") == Some(kind))
        .ok_or_else(|| bad_kind(py, op, kind))
}

/// A rope's pairing from its name: "interleaved" (also "normal", "gptj") or "neox".
pub(crate) fn parse_style(py: Python<'_>, style: &str) -> PyResult<RopeStyle> {
    match style {
        "interleaved" | "normal" | "gptj" => Ok(RopeStyle::Interleaved),
        "neox" => Ok(RopeStyle::NeoX),
        other => Err(trace_error_kind(
            py,
            "shape",
            Some("rope"),
            None,
            format!("rope: style must be \"interleaved\" or \"neox\", got {other:?}"),
        )),
    }
}
