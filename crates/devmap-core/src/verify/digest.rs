//! One tensor's bytes, summed up while they stream past: a 128-bit XXH3 hash, whether
//! every element is the same (and zero), and how many elements are NaN or infinite.

use xxhash_rust::xxh3::Xxh3;

use crate::types::DType;

/// What a tensor's bytes amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    pub hash: u128,
    pub uniform: Uniform,
    pub nonfinite: NonFinite,
}

/// NaN and infinite elements of a floating-point tensor (zero for other dtypes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NonFinite {
    pub nan: u64,
    pub inf: u64,
}

/// How to tell a non-finite element by its little-endian bits: the exponent mask
/// (all ones: not finite) and the mantissa mask (zero: infinite, else NaN).
#[derive(Debug, Clone, Copy)]
enum Float {
    None,
    /// One byte: float8 e4m3 (NaN is S.1111.111, no infinity) or e5m2.
    E4M3,
    E5M2,
    Bits16 {
        exponent: u16,
        mantissa: u16,
    },
    Bits32,
    Bits64,
}

impl Float {
    fn of(dtype: DType) -> Float {
        match dtype {
            DType::F16 => Float::Bits16 {
                exponent: 0x7c00,
                mantissa: 0x03ff,
            },
            DType::BF16 => Float::Bits16 {
                exponent: 0x7f80,
                mantissa: 0x007f,
            },
            DType::F32 => Float::Bits32,
            DType::F64 => Float::Bits64,
            DType::F8E4M3 => Float::E4M3,
            DType::F8E5M2 => Float::E5M2,
            _ => Float::None,
        }
    }

    /// Adds `chunk`'s (whole elements') NaNs and infinities to `count`. This runs on
    /// every byte verify reads, so it first counts the elements whose exponent is all
    /// ones with a loop the compiler vectorises; only a chunk that has some (rare in a
    /// model) is classified element by element.
    fn count(self, chunk: &[u8], count: &mut NonFinite) {
        match self {
            Float::None => {}
            Float::E4M3 => {
                // e4m3fn: S.1111.111 is NaN; there is no infinity.
                count.nan += chunk.iter().filter(|&&b| b & 0x7f == 0x7f).count() as u64;
            }
            Float::E5M2 => {
                for &b in chunk.iter().filter(|&&b| b & 0x7c == 0x7c) {
                    if b.trailing_zeros() >= 2 {
                        count.inf += 1;
                    } else {
                        count.nan += 1;
                    }
                }
            }
            Float::Bits16 { exponent, mantissa } => {
                let bits = || {
                    chunk
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]]))
                };
                // Zero exactly when some element's exponent is all ones (a min over
                // the lanes, which vectorises).
                if bits().fold(u16::MAX, |m, b| m.min(!b & exponent)) == 0 {
                    for b in bits().filter(|b| b & exponent == exponent) {
                        if b & mantissa == 0 {
                            count.inf += 1;
                        } else {
                            count.nan += 1;
                        }
                    }
                }
            }
            Float::Bits32 => {
                const EXP: u32 = 0x7f80_0000;
                let bits = || {
                    chunk
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                };
                if bits().fold(u32::MAX, |m, b| m.min(!b & EXP)) == 0 {
                    for b in bits().filter(|b| b & EXP == EXP) {
                        if b.trailing_zeros() >= 23 {
                            count.inf += 1;
                        } else {
                            count.nan += 1;
                        }
                    }
                }
            }
            Float::Bits64 => {
                const EXP: u64 = 0x7ff0_0000_0000_0000;
                for c in chunk.chunks_exact(8) {
                    let b = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                    if b & EXP == EXP {
                        if b.trailing_zeros() >= 52 {
                            count.inf += 1;
                        } else {
                            count.nan += 1;
                        }
                    }
                }
            }
        }
    }
}

/// Whether all elements are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uniform {
    /// At least two elements differ (or the tensor has at most one element).
    No,
    /// Every byte is zero.
    Zero,
    /// Every element holds the same non-zero bit pattern.
    Same,
}

/// Feeds on a tensor's bytes chunk by chunk.
pub struct Digester {
    hash: Xxh3,
    element: usize,
    first: Vec<u8>,
    seen: u64,
    same: bool,
    float: Float,
    nonfinite: NonFinite,
}

impl Digester {
    /// For elements of `dtype`.
    pub fn new(dtype: DType) -> Digester {
        Digester {
            hash: Xxh3::new(),
            element: (dtype.size() as usize).max(1),
            first: Vec::new(),
            seen: 0,
            same: true,
            float: Float::of(dtype),
            nonfinite: NonFinite::default(),
        }
    }

    pub fn update(&mut self, chunk: &[u8]) {
        self.hash.update(chunk);
        // Chunks are whole elements (the copier cuts at element boundaries).
        self.float.count(chunk, &mut self.nonfinite);
        if self.same {
            self.same = self.still_same(chunk);
        }
        self.seen += chunk.len() as u64;
    }

    /// Whether the elements so far and those of `chunk` all equal the first one. A
    /// chunk is uniform when it equals itself shifted by one element (a memcmp, so this
    /// costs little next to reading); it then only has to start with the first element.
    fn still_same(&mut self, chunk: &[u8]) -> bool {
        let e = self.element;
        if !chunk.len().is_multiple_of(e) || !self.seen.is_multiple_of(e as u64) {
            // Chunks are whole elements; if one is not, say "not uniform" rather
            // than guess (the answer only feeds a note).
            return false;
        }
        if chunk.is_empty() {
            return true;
        }
        if self.first.is_empty() {
            self.first = chunk[..e].to_vec();
        }
        chunk[..e] == self.first[..] && chunk[e..] == chunk[..chunk.len() - e]
    }

    pub fn finish(self) -> Digest {
        let uniform = if !self.same || self.seen <= self.element as u64 {
            Uniform::No
        } else if self.first.iter().all(|&b| b == 0) {
            Uniform::Zero
        } else {
            Uniform::Same
        };
        Digest {
            hash: self.hash.digest128(),
            uniform,
            nonfinite: self.nonfinite,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(element: usize, chunks: &[&[u8]]) -> Digest {
        let dtype = match element {
            2 => DType::BF16,
            4 => DType::F32,
            _ => DType::U8,
        };
        digest_as(dtype, chunks)
    }

    fn digest_as(dtype: DType, chunks: &[&[u8]]) -> Digest {
        let mut d = Digester::new(dtype);
        for c in chunks {
            d.update(c);
        }
        d.finish()
    }

    #[test]
    fn uniformity_is_per_element_across_chunks() {
        let ones = 1.0f32.to_le_bytes().repeat(4);
        assert_eq!(digest(4, &[&ones, &ones]).uniform, Uniform::Same);
        assert_eq!(digest(4, &[&[0; 8], &[0; 12]]).uniform, Uniform::Zero);
        // Uniform chunks that disagree with each other.
        let twos = 2.0f32.to_le_bytes().repeat(4);
        assert_eq!(digest(4, &[&ones, &twos]).uniform, Uniform::No);
        // Bytes equal in pairs but not as 4-byte elements.
        assert_eq!(digest(4, &[&[1, 2, 1, 2, 1, 2, 1, 1]]).uniform, Uniform::No);
        // The same bytes as 2-byte elements are uniform until the last one.
        assert_eq!(digest(2, &[&[1, 2, 1, 2, 1, 2]]).uniform, Uniform::Same);
        // One element says nothing.
        assert_eq!(digest(4, &[&[0; 4]]).uniform, Uniform::No);
    }

    #[test]
    fn the_hash_does_not_depend_on_chunking() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let whole = digest(2, &[&bytes]).hash;
        let (a, b) = bytes.split_at(4_096);
        assert_eq!(digest(2, &[a, b]).hash, whole);
        let mut flipped = bytes.clone();
        flipped[9_999] ^= 1;
        assert_ne!(digest(2, &[&flipped]).hash, whole);
    }

    #[test]
    fn nans_and_infinities_are_counted_per_dtype() {
        let f32s: Vec<u8> = [
            1.0f32,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            -0.0,
            f32::MAX,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
        let (a, b) = f32s.split_at(8);
        assert_eq!(
            digest_as(DType::F32, &[a, b]).nonfinite,
            NonFinite { nan: 1, inf: 2 }
        );
        let f64s: Vec<u8> = [f64::NAN, 2.0, f64::NEG_INFINITY]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            digest_as(DType::F64, &[&f64s]).nonfinite,
            NonFinite { nan: 1, inf: 1 }
        );
        // bfloat16: 0x7fc0 NaN, 0xff80 -inf, 0x7f7f the largest finite.
        let bf16 = [0xc0, 0x7f, 0x80, 0xff, 0x7f, 0x7f];
        assert_eq!(
            digest_as(DType::BF16, &[&bf16]).nonfinite,
            NonFinite { nan: 1, inf: 1 }
        );
        // float16: 0x7c00 inf, 0x7e00 NaN, 0x7bff the largest finite.
        let f16 = [0x00, 0x7c, 0x00, 0x7e, 0xff, 0x7b];
        assert_eq!(
            digest_as(DType::F16, &[&f16]).nonfinite,
            NonFinite { nan: 1, inf: 1 }
        );
        // e4m3: 0x7f and 0xff NaN, 0x7e (448) finite; e5m2: 0x7c inf, 0x7d NaN.
        assert_eq!(
            digest_as(DType::F8E4M3, &[&[0x7f, 0xff, 0x7e]]).nonfinite,
            NonFinite { nan: 2, inf: 0 }
        );
        assert_eq!(
            digest_as(DType::F8E5M2, &[&[0x7c, 0x7d, 0x7b]]).nonfinite,
            NonFinite { nan: 1, inf: 1 }
        );
        // Integers have no NaN.
        assert_eq!(
            digest_as(DType::I32, &[&[0xff; 8]]).nonfinite,
            NonFinite::default()
        );
    }
}
