//! The packed weight formats the kernels read, named once: [`Format`] (each format's block
//! size, bytes per block and how its rows are read, [`Rows`]), the one conversion from
//! `poot_core::DType` ([`Format::of`]), and the `u8` ids const-generic loops are monomorphized
//! over ([`id`], `Format::X as u8`: stable Rust has no enum const generics).
//!
//! Invariants: [`Format::ALL`] lists every variant in declaration order, so `Format::ALL[f as
//! usize] == f` and [`Format::from_id`] inverts `as u8`; [`Format::block_bytes`] and
//! [`Format::block_elems`] equal `poot_core::DType`'s for the same format (tested below). This
//! module imports no other kernel module: every kernel, the per-ISA loops included, may import it.
//!
//! A new dtype goes here: a variant (last, so the ids of the others keep their values), its line
//! in [`Format::of`], its block shape and its [`Rows`]; then its decoder in the block decoders'
//! module, and for an integer dot its kernels in the family [`Rows`] names.

use poot_core::DType;

/// A packed weight format the kernels decode (matmul weights, embedding tables, norm
/// weights), proved when the weight is validated so the hot paths match exhaustively.
#[allow(non_camel_case_types, reason = "ggml's names")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub(crate) enum Format {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    /// poot's zero-point block (GPTQ/AWQ 4-bit): `y = (q - z) * d`.
    Q4_Z,
    /// poot's zero-point block (GPTQ 8-bit): `y = (q - z) * d`.
    Q8_Z,
    /// poot's FP8 block: E4M3 bytes and an `f32` scale.
    F8_S,
}

/// How a format's rows are read under ggml's numerics (the exact numerics decode every format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Rows {
    /// F16 and F32 read as stored, in ggml's float dot orders.
    Float,
    /// BF16 against bf16-rounded activations.
    Bf16,
    /// 32-value blocks with an integer dot against Q8_0 (Q4_1: Q8_1) activation blocks: Q4_0,
    /// Q4_1, Q5_0, Q8_0, and the zero-point Q4_Z and Q8_Z (the zero folded into the integers).
    Q8,
    /// 256-value super-blocks with an integer dot against Q8_K activations: Q4_K, Q6_K.
    Q8K,
    /// E4M3 widened in registers against `f32` activations: F8_S.
    F8,
    /// Decoded to `f32` first: the formats with no dot of their own.
    Decoded,
}

impl Format {
    /// Every format, in declaration (id) order.
    pub(crate) const ALL: [Format; 17] = [
        Format::F32,
        Format::F16,
        Format::BF16,
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q8_0,
        Format::Q2_K,
        Format::Q3_K,
        Format::Q4_K,
        Format::Q5_K,
        Format::Q6_K,
        Format::Q8_K,
        Format::Q4_Z,
        Format::Q8_Z,
        Format::F8_S,
    ];

    /// The kernels' format of `dtype`, if they support it: the one place a `DType` becomes a
    /// [`Format`].
    pub(crate) const fn of(dtype: DType) -> Option<Format> {
        Some(match dtype {
            DType::F32 => Format::F32,
            DType::F16 => Format::F16,
            DType::BF16 => Format::BF16,
            DType::Q4_0 => Format::Q4_0,
            DType::Q4_1 => Format::Q4_1,
            DType::Q5_0 => Format::Q5_0,
            DType::Q5_1 => Format::Q5_1,
            DType::Q8_0 => Format::Q8_0,
            DType::Q2_K => Format::Q2_K,
            DType::Q3_K => Format::Q3_K,
            DType::Q4_K => Format::Q4_K,
            DType::Q5_K => Format::Q5_K,
            DType::Q6_K => Format::Q6_K,
            DType::Q8_K => Format::Q8_K,
            DType::Q4_Z => Format::Q4_Z,
            DType::Q8_Z => Format::Q8_Z,
            DType::F8_S => Format::F8_S,
            _ => return None,
        })
    }

    /// The `DType` this format stores.
    pub(crate) const fn dtype(self) -> DType {
        match self {
            Format::F32 => DType::F32,
            Format::F16 => DType::F16,
            Format::BF16 => DType::BF16,
            Format::Q4_0 => DType::Q4_0,
            Format::Q4_1 => DType::Q4_1,
            Format::Q5_0 => DType::Q5_0,
            Format::Q5_1 => DType::Q5_1,
            Format::Q8_0 => DType::Q8_0,
            Format::Q2_K => DType::Q2_K,
            Format::Q3_K => DType::Q3_K,
            Format::Q4_K => DType::Q4_K,
            Format::Q5_K => DType::Q5_K,
            Format::Q6_K => DType::Q6_K,
            Format::Q8_K => DType::Q8_K,
            Format::Q4_Z => DType::Q4_Z,
            Format::Q8_Z => DType::Q8_Z,
            Format::F8_S => DType::F8_S,
        }
    }

    /// The format whose id (`Format::X as u8`) is `id`; a const-generic loop's way back.
    ///
    /// # Panics
    /// If `id` names no format (at compile time where it is evaluated in a const).
    #[inline(always)]
    pub(crate) const fn from_id(id: u8) -> Format {
        Format::ALL[id as usize]
    }

    /// Values in one block (1 for the plain floats).
    #[inline(always)]
    pub(crate) const fn block_elems(self) -> usize {
        match self {
            Format::F32 | Format::F16 | Format::BF16 => 1,
            Format::Q2_K
            | Format::Q3_K
            | Format::Q4_K
            | Format::Q5_K
            | Format::Q6_K
            | Format::Q8_K => 256,
            _ => 32,
        }
    }

    /// Bytes of one block.
    #[inline(always)]
    pub(crate) const fn block_bytes(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::F16 | Format::BF16 => 2,
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q8_0 => 34,
            Format::Q2_K => 84,
            Format::Q3_K => 110,
            Format::Q4_K => 144,
            Format::Q5_K => 176,
            Format::Q6_K => 210,
            Format::Q8_K => 292,
            Format::Q4_Z => 19,
            Format::Q8_Z | Format::F8_S => 36,
        }
    }

    /// How the format's rows are read under ggml's numerics (see [`Rows`]).
    pub(crate) const fn rows(self) -> Rows {
        match self {
            Format::F32 | Format::F16 => Rows::Float,
            Format::BF16 => Rows::Bf16,
            Format::Q4_0 | Format::Q4_1 | Format::Q5_0 | Format::Q8_0 => Rows::Q8,
            Format::Q4_Z | Format::Q8_Z => Rows::Q8,
            Format::Q4_K | Format::Q6_K => Rows::Q8K,
            Format::F8_S => Rows::F8,
            Format::Q5_1 | Format::Q2_K | Format::Q3_K | Format::Q5_K | Format::Q8_K => {
                Rows::Decoded
            }
        }
    }

    /// Whether the format has a zero point (`y = (q - z) * d`: Q4_Z, Q8_Z).
    pub(crate) const fn zero_point(self) -> bool {
        matches!(self, Format::Q4_Z | Format::Q8_Z)
    }

    /// Whether its Q8 activations are Q8_1 (carry the block sum `s`): ggml pairs Q4_1 with
    /// Q8_1.
    pub(crate) const fn act_sum(self) -> bool {
        matches!(self, Format::Q4_1)
    }
}

/// Every dtype the kernels decode (matmul weights, embedding tables, norm weights).
pub const DECODABLE: [DType; 17] = {
    let mut out = [DType::F32; 17];
    let mut i = 0;
    while i < out.len() {
        out[i] = Format::ALL[i].dtype();
        i += 1;
    }
    out
};

/// The formats' ids as `u8` consts, for the const-generic loops (`loop::<{ id::Q4_0 }>`), each
/// `Format::X as u8` so that [`Format`] stays the one list (the formats that have such a loop).
pub(crate) mod id {
    use super::Format;

    pub(crate) const F32: u8 = Format::F32 as u8;
    pub(crate) const F16: u8 = Format::F16 as u8;
    pub(crate) const BF16: u8 = Format::BF16 as u8;
    pub(crate) const Q4_0: u8 = Format::Q4_0 as u8;
    pub(crate) const Q4_1: u8 = Format::Q4_1 as u8;
    pub(crate) const Q5_0: u8 = Format::Q5_0 as u8;
    pub(crate) const Q8_0: u8 = Format::Q8_0 as u8;
    pub(crate) const Q4_K: u8 = Format::Q4_K as u8;
    pub(crate) const Q6_K: u8 = Format::Q6_K as u8;
    pub(crate) const Q4_Z: u8 = Format::Q4_Z as u8;
    pub(crate) const Q8_Z: u8 = Format::Q8_Z as u8;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_id_order_and_from_id_inverts_it() {
        for (i, f) in Format::ALL.into_iter().enumerate() {
            assert_eq!(f as usize, i, "{f:?}");
            assert_eq!(Format::from_id(f as u8), f);
        }
    }

    #[test]
    fn of_covers_exactly_the_decodable_list_with_the_dtypes_block_shape() {
        for dt in DType::ALL {
            let f = Format::of(dt);
            assert_eq!(f.is_some(), DECODABLE.contains(&dt), "{dt}");
            if let Some(f) = f {
                assert_eq!(f.dtype(), dt);
                assert_eq!(f.block_bytes(), dt.block_bytes() as usize, "{dt}");
                assert_eq!(f.block_elems(), dt.block_elems() as usize, "{dt}");
                assert!(poot_core::quant::supports(dt), "{dt} has no reference");
            }
        }
    }
}
