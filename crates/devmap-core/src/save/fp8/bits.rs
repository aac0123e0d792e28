//! FP8 codes decoded on their bits, not looked up: what lets a loop over a block's
//! codes vectorise (`lookup::dequantize_codes`).

use crate::types::DType;

/// How an FP8 format's codes decode on the bits: where a code's exponent and mantissa
/// bits go among a float32's, what takes float32's exponent bias to the format's (added
/// to the exponent field), the value of a subnormal code's least mantissa step so
/// placed, and the bits that mark the codes this cannot decode (infinity, NaN).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fp8Bits {
    shift: u32,
    rebias: u32,
    least: f32,
    special: u8,
}

impl Fp8Bits {
    /// E4M3 (`float8_e4m3fn`: bias 7, NaN at S.1111.111, no infinity) and E5M2 (bias
    /// 15, infinities and NaNs where the exponent's bits are all set); none for others.
    pub(crate) fn of(from: DType) -> Option<Fp8Bits> {
        match from {
            DType::F8E4M3 => Some(Fp8Bits {
                shift: 20,
                rebias: 120 << 23,
                least: f32::from_bits((127 - 9 - 20) << 23),
                special: 0x7F,
            }),
            DType::F8E5M2 => Some(Fp8Bits {
                shift: 21,
                rebias: 112 << 23,
                least: f32::from_bits((127 - 16 - 21) << 23),
                special: 0x7C,
            }),
            _ => None,
        }
    }

    /// Whether any code is one [`Fp8Bits::value`] does not decode. Every code is
    /// looked at (no early exit), so the loop vectorises.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn any_special(self, codes: &[u8]) -> bool {
        codes.iter().fold(0u8, |any, &c| {
            any | u8::from(c & self.special == self.special)
        }) != 0
    }

    /// A code's value, exactly: a normal code's exponent and mantissa bits placed as a
    /// float32's, its exponent rebiased by an integer add; a subnormal one's mantissa
    /// converted and scaled by a power of two (no float32 subnormal is ever formed: on
    /// some CPUs each costs a microcode assist); then its sign. Selected by masks, so a
    /// loop over it vectorises. Not for the codes [`Fp8Bits::any_special`] finds.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn value(self, c: u8) -> f32 {
        let c = u32::from(c);
        let field = (c & 0x7F) << self.shift;
        // A normal code: float32's exponent bias added to its exponent field.
        let normal = field + self.rebias;
        // A subnormal one (exponent 0): its mantissa times the least subnormal.
        let subnormal = (field as f32 * self.least).to_bits();
        let pick = 0u32.wrapping_sub(u32::from(field < 1 << 23));
        f32::from_bits((subnormal & pick) | (normal & !pick) | ((c & 0x80) << 24))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every FP8 code decoded on its bits is its value in the formats' tables, bit for
    /// bit (subnormals and −0 included), and the codes left to the tables are exactly
    /// the ones whose value is not finite.
    #[test]
    fn fp8_codes_decode_on_the_bits_as_the_tables_say() {
        for from in [DType::F8E4M3, DType::F8E5M2] {
            let format = Fp8Bits::of(from).expect("an FP8 format");
            let values = super::super::values(from);
            for c in 0..=255u8 {
                let special = format.any_special(&[c]);
                assert_eq!(
                    special,
                    !values[usize::from(c)].is_finite(),
                    "{from:?} {c:#04x}"
                );
                if !special {
                    assert_eq!(
                        format.value(c).to_bits(),
                        values[usize::from(c)].to_bits(),
                        "{from:?} {c:#04x}"
                    );
                }
            }
            assert!(format.any_special(&[0, 1, 2, 0xFF, 3]));
            assert!(!format.any_special(&[0, 1, 2, 0x70, 3]));
        }
    }
}
