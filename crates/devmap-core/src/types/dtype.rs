//! Element types, with the names each file format uses for them.

use std::fmt;

/// The element type of a tensor.
///
/// Sub-byte types (F4, F6) are not supported: their byte size is not a whole
/// number of elements, and no offload format writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    Bool,
    U8,
    I8,
    F8E4M3,
    F8E5M2,
    F8E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    I64,
    U64,
    F64,
}

impl DType {
    /// Whether scales stored in this dtype are E8M0 exponents (`2^(e − 127)`):
    /// `F8_E8M0`, or the U8 bytes MXFP8 and some DeepSeek-V4 exports store them as.
    pub fn holds_e8m0_scales(self) -> bool {
        matches!(self, DType::U8 | DType::F8E8M0)
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::Bool | DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2 | DType::F8E8M0 => {
                1
            }
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
        }
    }

    /// The name in a safetensors header (`"BF16"`, `"F8_E4M3"`, ...).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::Bool => "BOOL",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::F8E8M0 => "F8_E8M0",
            DType::I16 => "I16",
            DType::U16 => "U16",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I32 => "I32",
            DType::U32 => "U32",
            DType::F32 => "F32",
            DType::C64 => "C64",
            DType::I64 => "I64",
            DType::U64 => "U64",
            DType::F64 => "F64",
        }
    }

    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        ALL.iter().copied().find(|d| d.safetensors_name() == name)
    }

    /// The name torch gives the type without its `torch.` prefix, as accelerate's and
    /// transformers' offload indexes write it (`"bfloat16"`, `"float8_e4m3fn"`).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::F8E4M3 => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E8M0 => "float8_e8m0fnu",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::F32 => "float32",
            DType::C64 => "complex64",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::F64 => "float64",
        }
    }

    /// Parses a torch or numpy dtype name, with or without `torch.`; also takes torch's
    /// short aliases (`half`, `float`, `long`, ...).
    pub fn from_torch_name(name: &str) -> Option<DType> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        let alias = match name {
            "half" => Some(DType::F16),
            "float" => Some(DType::F32),
            "double" => Some(DType::F64),
            "long" => Some(DType::I64),
            "int" => Some(DType::I32),
            "short" => Some(DType::I16),
            "float8_e4m3fnuz" => Some(DType::F8E4M3),
            "float8_e5m2fnuz" => Some(DType::F8E5M2),
            _ => None,
        };
        alias.or_else(|| ALL.iter().copied().find(|d| d.torch_name() == name))
    }
}

const ALL: [DType; 17] = [
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::F8E4M3,
    DType::F8E5M2,
    DType::F8E8M0,
    DType::I16,
    DType::U16,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::U32,
    DType::F32,
    DType::C64,
    DType::I64,
    DType::U64,
    DType::F64,
];

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

/// Number of elements of `shape`, or `None` when the product overflows `u64`.
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Bytes a tensor of this shape and type takes, or `None` on overflow.
pub fn byte_len(dtype: DType, shape: &[u64]) -> Option<u64> {
    numel(shape)?.checked_mul(dtype.size())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in ALL {
            assert_eq!(DType::from_safetensors_name(d.safetensors_name()), Some(d));
            assert_eq!(DType::from_torch_name(d.torch_name()), Some(d));
        }
        assert_eq!(DType::from_torch_name("torch.bfloat16"), Some(DType::BF16));
        assert_eq!(DType::from_torch_name("half"), Some(DType::F16));
        assert_eq!(DType::from_safetensors_name("F4"), None);
        assert_eq!(DType::from_torch_name("quint8"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::F8E4M3.size(), 1);
        assert_eq!(DType::I64.size(), 8);
        assert_eq!(DType::Bool.size(), 1);
        assert_eq!(byte_len(DType::F32, &[3, 4]), Some(48));
        assert_eq!(byte_len(DType::F32, &[]), Some(4), "0-dim is one element");
        assert_eq!(byte_len(DType::F32, &[0, 7]), Some(0));
        assert_eq!(byte_len(DType::F32, &[u64::MAX, 2]), None);
        assert_eq!(byte_len(DType::F64, &[1 << 62]), None);
    }
}
