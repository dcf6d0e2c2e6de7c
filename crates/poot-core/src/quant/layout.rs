//! Byte layouts of ggml's packed blocks, as offsets into a block's bytes.
//!
//! Invariants: every layout's fields tile its block exactly, in order, from byte 0 to
//! `dtype.block_bytes()`; multi-byte fields are little-endian (ggml writes host order, and every
//! GGUF producer in use is little-endian). Blocks are read from `&[u8]` by these offsets, never
//! by casting to a `#[repr(C)]` struct, so alignment of the source does not matter.
//!
//! The names are ggml's (`ggml-common.h`), so a kernel author can read both side by side.

use std::ops::Range;

use crate::DType;

/// One field of a packed block: a byte range and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// ggml's name for the field (`d`, `qs`, `scales`, ...).
    pub name: &'static str,
    /// Byte offset from the start of the block.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// What the bytes encode.
    pub what: &'static str,
}

impl Field {
    const fn new(name: &'static str, offset: usize, len: usize, what: &'static str) -> Self {
        Field {
            name,
            offset,
            len,
            what,
        }
    }

    /// One past the last byte of the field.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }

    /// The field's bytes as a range, for slicing a block.
    pub const fn range(&self) -> Range<usize> {
        self.offset..self.end()
    }
}

/// The layout of one block of a dtype: its element count and its fields in byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    pub dtype: DType,
    /// Elements one block decodes to.
    pub elems: usize,
    /// Fields in byte order; they tile `0..bytes()` with no gap.
    pub fields: &'static [Field],
}

impl BlockLayout {
    /// Bytes per block: the end of the last field.
    pub const fn bytes(&self) -> usize {
        match self.fields.last() {
            Some(f) => f.end(),
            None => 0,
        }
    }
}

/// The block layout of `dtype`, for the dtypes ggml stores in packed blocks plus the plain
/// floats poot dequantizes (`F32`, `F16`, `BF16`, one element per "block").
pub const fn layout(dtype: DType) -> Option<&'static BlockLayout> {
    Some(match dtype {
        DType::F32 => &float32::LAYOUT,
        DType::F16 => &float16::LAYOUT,
        DType::BF16 => &bfloat16::LAYOUT,
        DType::Q4_0 => &q4_0::LAYOUT,
        DType::Q4_1 => &q4_1::LAYOUT,
        DType::Q5_0 => &q5_0::LAYOUT,
        DType::Q5_1 => &q5_1::LAYOUT,
        DType::Q8_0 => &q8_0::LAYOUT,
        DType::Q8_1 => &q8_1::LAYOUT,
        DType::Q2_K => &q2_k::LAYOUT,
        DType::Q3_K => &q3_k::LAYOUT,
        DType::Q4_K => &q4_k::LAYOUT,
        DType::Q5_K => &q5_k::LAYOUT,
        DType::Q6_K => &q6_k::LAYOUT,
        DType::Q8_K => &q8_k::LAYOUT,
        DType::Q4_Z => &q4_z::LAYOUT,
        DType::Q8_Z => &q8_z::LAYOUT,
        DType::F8_S => &f8_s::LAYOUT,
        _ => return None,
    })
}

/// Declares one dtype's fields as named consts plus `LAYOUT`, `BYTES` and `ELEMS`.
macro_rules! block {
    ($(#[$doc:meta])* $m:ident, $dtype:ident, $elems:expr,
     [$($f:ident = ($name:literal, $off:expr, $len:expr, $what:literal)),+ $(,)?]) => {
        $(#[$doc])*
        pub mod $m {
            use super::{BlockLayout, Field};
            $(
                #[doc = $what]
                pub const $f: Field = Field::new($name, $off, $len, $what);
            )+
            pub const LAYOUT: BlockLayout =
                BlockLayout { dtype: crate::DType::$dtype, elems: $elems, fields: &[$($f),+] };
            /// Bytes per block.
            pub const BYTES: usize = LAYOUT.bytes();
            /// Elements per block.
            pub const ELEMS: usize = $elems;
        }
    };
}

block!(
    /// IEEE binary32.
    float32, F32, 1, [X = ("x", 0, 4, "f32 value")]
);
block!(
    /// IEEE binary16.
    float16, F16, 1, [X = ("x", 0, 2, "f16 value")]
);
block!(
    /// bfloat16: the high half of an f32.
    bfloat16, BF16, 1, [X = ("x", 0, 2, "bf16 value (upper 16 bits of an f32)")]
);
block!(
    /// `x = (q - 8) * d`.
    q4_0, Q4_0, 32, [
        D = ("d", 0, 2, "f16 scale"),
        QS = ("qs", 2, 16, "4-bit quants: byte j holds element j (low nibble) and j+16 (high)"),
    ]
);
block!(
    /// poot's GPTQ/AWQ int4 block: `x = (q - z) * d`, z an integer zero point (0..=16: GPTQ
    /// v1's `+1` convention can reach 16). Not a ggml type; the nibble order is Q4_0's.
    q4_z, Q4_Z, 32, [
        D = ("d", 0, 2, "f16 scale"),
        Z = ("z", 2, 1, "u8 zero point"),
        QS = ("qs", 3, 16, "4-bit quants: byte j holds element j (low nibble) and j+16 (high)"),
    ]
);
block!(
    /// poot's 8-bit GPTQ block: `x = (q - z) * d`, q a u8, z a u16 (0..=256: v1's `+1`).
    q8_z, Q8_Z, 32, [
        D = ("d", 0, 2, "f16 scale"),
        Z = ("z", 2, 2, "u16 zero point"),
        QS = ("qs", 4, 32, "u8 quants, element j in byte j"),
    ]
);
block!(
    /// poot's FP8 block: `x = e4m3(q) * d` (OCP E4M3: no infinities, 0x7f/0xff NaN), d the
    /// f32 scale of the block's 32 weights.
    f8_s, F8_S, 32, [
        D = ("d", 0, 4, "f32 scale"),
        QS = ("qs", 4, 32, "E4M3 bytes, element j in byte j"),
    ]
);
block!(
    /// `x = q * d + m`.
    q4_1, Q4_1, 32, [
        D = ("d", 0, 2, "f16 scale"),
        M = ("m", 2, 2, "f16 minimum"),
        QS = ("qs", 4, 16, "4-bit quants: byte j holds element j (low nibble) and j+16 (high)"),
    ]
);
block!(
    /// `x = (q - 16) * d`, q a 5-bit value.
    q5_0, Q5_0, 32, [
        D = ("d", 0, 2, "f16 scale"),
        QH = ("qh", 2, 4, "u32 of fifth bits: bit j belongs to element j"),
        QS = ("qs", 6, 16, "low 4 bits: byte j holds element j (low nibble) and j+16 (high)"),
    ]
);
block!(
    /// `x = q * d + m`, q a 5-bit value.
    q5_1, Q5_1, 32, [
        D = ("d", 0, 2, "f16 scale"),
        M = ("m", 2, 2, "f16 minimum"),
        QH = ("qh", 4, 4, "u32 of fifth bits: bit j belongs to element j"),
        QS = ("qs", 8, 16, "low 4 bits: byte j holds element j (low nibble) and j+16 (high)"),
    ]
);
block!(
    /// `x = q * d`.
    q8_0, Q8_0, 32, [
        D = ("d", 0, 2, "f16 scale"),
        QS = ("qs", 2, 32, "i8 quants"),
    ]
);
block!(
    /// The activation format of the Q4_1/Q5_1 dot products; ggml has no dequantizer for it.
    q8_1, Q8_1, 32, [
        D = ("d", 0, 2, "f16 scale"),
        S = ("s", 2, 2, "f16 d * sum(qs)"),
        QS = ("qs", 4, 32, "i8 quants"),
    ]
);
block!(
    /// 16 sub-blocks of 16: `x = d * (sc & 15) * q - dmin * (sc >> 4)`, q 2-bit.
    q2_k, Q2_K, 256, [
        SCALES = ("scales", 0, 16, "per sub-block: 4-bit scale (low) and 4-bit min (high)"),
        QS = ("qs", 16, 64, "2-bit quants, four per byte"),
        D = ("d", 80, 2, "f16 super-block scale for the scales"),
        DMIN = ("dmin", 82, 2, "f16 super-block scale for the mins"),
    ]
);
block!(
    /// 16 sub-blocks of 16: `x = d * (sc - 32) * (q - (h ? 0 : 4))`, q 2-bit, sc 6-bit.
    q3_k, Q3_K, 256, [
        HMASK = ("hmask", 0, 32, "high bits, inverted: a set bit means no -4"),
        QS = ("qs", 32, 64, "low 2 bits of the quants, four per byte"),
        SCALES = ("scales", 96, 12, "16 6-bit scales, packed"),
        D = ("d", 108, 2, "f16 super-block scale"),
    ]
);
block!(
    /// 8 sub-blocks of 32: `x = (d * sc) * q - dmin * m`, q 4-bit, sc and m 6-bit.
    q4_k, Q4_K, 256, [
        D = ("d", 0, 2, "f16 super-block scale for the scales"),
        DMIN = ("dmin", 2, 2, "f16 super-block scale for the mins"),
        SCALES = ("scales", 4, 12, "8 6-bit scales and 8 6-bit mins, packed"),
        QS = ("qs", 16, 128, "4-bit quants: each 32 bytes hold two sub-blocks (low, high)"),
    ]
);
block!(
    /// 8 sub-blocks of 32: `x = (d * sc) * q - dmin * m`, q 5-bit, sc and m 6-bit.
    q5_k, Q5_K, 256, [
        D = ("d", 0, 2, "f16 super-block scale for the scales"),
        DMIN = ("dmin", 2, 2, "f16 super-block scale for the mins"),
        SCALES = ("scales", 4, 12, "8 6-bit scales and 8 6-bit mins, packed"),
        QH = ("qh", 16, 32, "fifth bits: bit s of byte l belongs to sub-block s, element l"),
        QS = ("qs", 48, 128, "low 4 bits: each 32 bytes hold two sub-blocks (low, high)"),
    ]
);
block!(
    /// 16 sub-blocks of 16: `x = (d * sc) * (q - 32)`, q 6-bit, sc i8.
    q6_k, Q6_K, 256, [
        QL = ("ql", 0, 128, "low 4 bits of the quants"),
        QH = ("qh", 128, 64, "high 2 bits of the quants, four per byte"),
        SCALES = ("scales", 192, 16, "i8 sub-block scales"),
        D = ("d", 208, 2, "f16 super-block scale"),
    ]
);
block!(
    /// The activation format of the k-quant dot products: `x = d * q`.
    q8_k, Q8_K, 256, [
        D = ("d", 0, 4, "f32 scale"),
        QS = ("qs", 4, 256, "i8 quants"),
        BSUMS = ("bsums", 260, 32, "i16 sums of each 16 quants"),
    ]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_tile_each_block_and_match_dtype_sizes() {
        let mut seen = 0;
        for dt in DType::ALL {
            let Some(l) = layout(dt) else { continue };
            seen += 1;
            assert_eq!(l.dtype, dt);
            let mut at = 0;
            for f in l.fields {
                assert_eq!(
                    f.offset, at,
                    "{dt}: field {} leaves a gap or overlaps",
                    f.name
                );
                assert!(f.len > 0, "{dt}: empty field {}", f.name);
                at = f.end();
            }
            assert_eq!(
                at as u64,
                dt.block_bytes(),
                "{dt}: fields do not cover the block"
            );
            assert_eq!(l.elems as u64, dt.block_elems(), "{dt}: element count");
        }
        assert_eq!(seen, 18);
    }

    #[test]
    fn module_consts_agree_with_layouts() {
        assert_eq!((q4_0::BYTES, q4_0::ELEMS), (18, 32));
        assert_eq!((q5_0::BYTES, q5_0::ELEMS), (22, 32));
        assert_eq!((q4_k::BYTES, q4_k::ELEMS), (144, 256));
        assert_eq!((q6_k::BYTES, q6_k::ELEMS), (210, 256));
        assert_eq!(q6_k::D.range(), 208..210);
    }
}
