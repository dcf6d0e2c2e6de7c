//! Element types and packed block layouts, as stored on disk.
//!
//! Invariants: every dtype is a run of fixed-size blocks; `block_elems` elements occupy exactly
//! `block_bytes` bytes, and a tensor's byte size is only defined when its element count is a
//! multiple of `block_elems`. The GGML ids and safetensors names are the ones the file formats
//! use, so a parser maps a stored code to a `DType` with no table of its own.

use std::fmt;

/// A stored element type: plain scalars and ggml's packed quantized blocks.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
    F8E4M3,
    F8E5M2,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    /// poot's own 4-bit block with an integer zero point (`y = (q - z) * d`), the in-memory
    /// form of GPTQ and AWQ int4 weights (`quant::hf`); no file stores it.
    Q4_Z,
    /// Its 8-bit sibling (`y = (q - z) * d`, q a u8, z a u16: GPTQ v1's `+1` reaches 256), the
    /// in-memory form of 8-bit GPTQ weights.
    Q8_Z,
    /// poot's FP8 block: an f32 scale and 32 OCP E4M3 bytes (`y = e4m3(q) * d`), the
    /// in-memory form of FP8 checkpoints' weights (`quant::hf_fp8`).
    F8_S,
}

impl DType {
    /// Every dtype, in a stable order (for tables and exhaustive tests).
    pub const ALL: [DType; 27] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::Bool,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::Q4_Z,
        DType::Q8_Z,
        DType::F8_S,
    ];

    /// Elements per block (1 for plain scalars).
    pub const fn block_elems(self) -> u64 {
        use DType::*;
        match self {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q4_Z | Q8_Z | F8_S => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => 256,
            _ => 1,
        }
    }

    /// Bytes per block (the element size for plain scalars).
    pub const fn block_bytes(self) -> u64 {
        use DType::*;
        match self {
            F64 | I64 => 8,
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 | U8 | Bool | F8E4M3 | F8E5M2 => 1,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            Q4_Z => 19,
            Q8_Z => 36,
            F8_S => 36,
        }
    }

    /// True for block-quantized types (ggml's, `Q4_Z`, `Q8_Z` and `F8_S`).
    pub const fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes needed for `n_elems` elements, or `None` when `n_elems` is not a whole number of
    /// blocks or the size overflows `u64`.
    pub fn bytes_for(self, n_elems: u64) -> Option<u64> {
        if !n_elems.is_multiple_of(self.block_elems()) {
            return None;
        }
        (n_elems / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// The dtype for a GGML type id, if poot knows its layout.
    pub const fn from_ggml(id: u32) -> Option<DType> {
        use DType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            _ => return None,
        })
    }

    /// The GGML type id, for dtypes GGUF can store.
    pub const fn ggml_id(self) -> Option<u32> {
        use DType::*;
        Some(match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            BF16 => 30,
            U8 | Bool | F8E4M3 | F8E5M2 | Q4_Z | Q8_Z | F8_S => return None,
        })
    }

    /// The dtype for a safetensors dtype string (`"BF16"`, `"F8_E4M3"`, ...).
    pub fn from_safetensors(name: &str) -> Option<DType> {
        use DType::*;
        Some(match name {
            "F64" => F64,
            "F32" => F32,
            "F16" => F16,
            "BF16" => BF16,
            "I64" => I64,
            "I32" => I32,
            "I16" => I16,
            "I8" => I8,
            "U8" => U8,
            "BOOL" => Bool,
            "F8_E4M3" => F8E4M3,
            "F8_E5M2" => F8E5M2,
            _ => return None,
        })
    }

    /// The name poot prints: ggml's names for GGUF types, safetensors' for the rest.
    pub const fn name(self) -> &'static str {
        use DType::*;
        match self {
            F64 => "F64",
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            I64 => "I64",
            I32 => "I32",
            I16 => "I16",
            I8 => "I8",
            U8 => "U8",
            Bool => "BOOL",
            F8E4M3 => "F8_E4M3",
            F8E5M2 => "F8_E5M2",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            Q4_Z => "Q4_Z",
            Q8_Z => "Q8_Z",
            F8_S => "F8_S",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip() {
        for dt in DType::ALL {
            if let Some(id) = dt.ggml_id() {
                assert_eq!(DType::from_ggml(id), Some(dt));
            }
        }
        assert_eq!(DType::from_ggml(4), None, "Q4_2 was removed from ggml");
    }

    #[test]
    fn byte_sizes_need_whole_blocks() {
        assert_eq!(DType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(DType::Q4_0.bytes_for(33), None);
        assert_eq!(DType::Q6_K.bytes_for(256), Some(210));
        assert_eq!(DType::F32.bytes_for(u64::MAX), None);
        assert_eq!(DType::Q4_Z.bytes_for(128), Some(76));
    }
}
