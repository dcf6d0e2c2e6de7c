//! Expert stacks of a quantized checkpoint: a MoE layer's experts are re-laid layers
//! `{p}.experts.{j}.{rest}` (`{rest}` being e.g. `gate_proj.weight`), described together as
//! `{p}.experts.{rest}` of shape `[E, out, in]` by the same rule as the plain store's stacks
//! (`weights`: ids `0..E`, one dtype and shape), whose `pieces` are the experts' re-laid copies
//! in expert order. The MoE matmul reads each expert's packed copy where it is: no float copy
//! of an expert is made, and no joined copy unless a runtime re-lays the stack again.
//!
//! An act-order expert (one whose columns were re-ordered, so it has an `input_perm`) is refused
//! by name: the expert matmul gathers no per-expert activation columns.

use std::collections::HashMap;

use super::{err, GptqAwqError, Relaid};
use crate::weights::{expert_of, stacks_of, Stack};

/// The complete expert stacks among the re-laid layers (see the module docs).
pub(super) fn expert_stacks(
    relaid: &HashMap<String, Relaid>,
) -> Result<HashMap<String, Stack>, GptqAwqError> {
    if let Some(perm) = relaid
        .keys()
        .filter(|n| n.ends_with(".input_perm") && expert_of(n).is_some())
        .min()
    {
        let layer = perm.trim_end_matches(".input_perm");
        return Err(err(
            &format!("{layer}.g_idx"),
            "g_idx",
            "an act-order expert layer (groups not in 32-column blocks) needs its input \
             columns permuted, which expert stacks do not support; quantize the experts \
             without act-order (desc_act: false)"
                .to_owned(),
        ));
    }
    Ok(stacks_of(
        relaid
            .iter()
            .filter(|(name, _)| name.ends_with(".weight"))
            .map(|(name, (_, dtype, shape))| (name.clone(), *dtype, shape.to_vec())),
    ))
}
