//! The FP8 re-lay of one layer (`quant_method: fp8` or compressed-tensors `float-quantized`):
//! E4M3 codes kept as stored, their scales (per tensor, per channel or per square block) laid
//! beside them as F8_S (`poot_core::quant::hf_fp8`).

use poot_core::quant::hf::HfQuantError;
use poot_core::quant::hf_fp8::{fp8_to_f8s, scales_to_f32, Fp8Scales};
use poot_core::DType;
use poot_formats::SafetensorsModel;

use super::{err, GptqAwqError, GptqAwqSpec, Layer};

/// Re-lays one FP8 layer (`<prefix>.weight` F8_E4M3 `[n, k]` with `weight_scale_inv` or
/// `weight_scale`).
pub(super) fn fp8_layer(
    model: &SafetensorsModel,
    prefix: &str,
    spec: GptqAwqSpec,
) -> Result<Layer, GptqAwqError> {
    let name = |part: &str| format!("{prefix}.{part}");
    let (wf, wt) = model.tensor(&name("weight")).expect("listed by dtype");
    let scale_name = ["weight_scale_inv", "weight_scale"]
        .into_iter()
        .map(name)
        .find(|n| model.tensor(n).is_some());
    let Some(scale_name) = scale_name else {
        return Err(err(
            &name("weight_scale_inv"),
            "missing_tensor",
            "is missing (FP8 layers need weight_scale_inv or weight_scale)",
        ));
    };
    let (sf, st) = model.tensor(&scale_name).expect("found");
    if wt.shape.len() != 2 {
        return Err(err(
            &name("weight"),
            "shape",
            format!(
                "has shape {:?}, expected [out_features, in_features]",
                wt.shape
            ),
        ));
    }
    let (n, k) = (wt.shape[0] as usize, wt.shape[1] as usize);
    let numel: u64 = st.shape.iter().product();
    let layout = if spec.group_size > 0 {
        let b = spec.group_size as usize;
        Fp8Scales::Block { rows: b, cols: b }
    } else if numel == 1 {
        Fp8Scales::Tensor
    } else {
        Fp8Scales::Channel
    };
    let want: Vec<u64> = match layout {
        Fp8Scales::Block { rows, cols } => vec![n.div_ceil(rows) as u64, k.div_ceil(cols) as u64],
        Fp8Scales::Channel => vec![n as u64, 1],
        Fp8Scales::Tensor => st.shape.clone(),
    };
    // Per-channel scales come as [n, 1] (compressed-tensors) or [n].
    let channel_1d = layout == Fp8Scales::Channel && st.shape == [n as u64];
    if st.shape != want && !channel_1d {
        return Err(err(
            &scale_name,
            "shape",
            format!(
                "has shape {:?}, expected {want:?} ({layout:?} scales of a {n} x {k} weight)",
                st.shape
            ),
        ));
    }
    let relay = || {
        let scales = scales_to_f32(st.dtype, sf.tensor_bytes(st))?;
        fp8_to_f8s(wf.tensor_bytes(wt), &scales, layout, (k, n))
    };
    let out = relay().map_err(|e: HfQuantError| {
        let (part, kind) = match &e {
            HfQuantError::Shape { tensor, .. } if *tensor == "weight" => (name("weight"), "shape"),
            HfQuantError::Scale { .. } => (scale_name.clone(), "dtype"),
            HfQuantError::Shape { .. } => (scale_name.clone(), "shape"),
            HfQuantError::NanCode { .. } => (name("weight"), "value"),
            _ => (name("weight"), "shape"),
        };
        err(&part, kind, e.to_string())
    })?;
    Ok((out, DType::F8_S, (k, n), None))
}
