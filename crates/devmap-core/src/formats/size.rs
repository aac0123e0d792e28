//! Byte sizes as users type them: `5GB` (decimal, as huggingface_hub and transformers
//! read it), `5GiB` (binary, as accelerate also accepts), or a plain byte count.

/// Why a size string was refused. Each variant keeps the text as typed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error(
        "`{0}` is not a size: use a number of bytes or a unit KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), e.g. 5GB"
    )]
    UnknownUnit(String),
    #[error("`{0}` is not a size: it has no number (e.g. 5GB)")]
    NoNumber(String),
    #[error("`{0}` is not a size: malformed number")]
    Malformed(String),
    #[error("`{0}` is too large")]
    TooLarge(String),
    #[error("`{0}`: too many decimals")]
    TooManyDecimals(String),
    #[error("`{0}`: the size must be more than zero")]
    Zero(String),
}

/// A size typed as a bare small number (`100`): bytes, as transformers reads it, but
/// rarely what was meant. The words that say so, with the guess; `None` otherwise.
pub fn unit_hint(text: &str) -> Option<String> {
    let t = text.trim();
    let n: u64 = t.parse().ok()?;
    (n < 1_000_000).then(|| {
        format!("a shard size of {t} is {t} bytes (no unit): every tensor gets a shard of its own; did you mean {t}MB or {t}GB?")
    })
}

/// Parses a size. Units are case-insensitive; spaces between number and unit are
/// allowed; fractions are allowed with a unit (`1.5GB`).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let owned = || text.to_owned();
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(SizeError::UnknownUnit(owned())),
    };
    if number.is_empty() {
        return Err(SizeError::NoNumber(owned()));
    }
    let value = if let Some((whole, frac)) = number.split_once('.') {
        if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
            return Err(SizeError::Malformed(owned()));
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| SizeError::TooLarge(owned()))?
        };
        let scale = 10u64
            .checked_pow(frac.len() as u32)
            .ok_or_else(|| SizeError::TooManyDecimals(owned()))?;
        let frac_value: u64 = if frac.is_empty() {
            0
        } else {
            frac.parse()
                .map_err(|_| SizeError::TooManyDecimals(owned()))?
        };
        let whole_bytes = whole.checked_mul(multiplier);
        let frac_bytes =
            (u128::from(frac_value) * u128::from(multiplier) / u128::from(scale)) as u64;
        whole_bytes.and_then(|w| w.checked_add(frac_bytes))
    } else {
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(multiplier))
    }
    .ok_or_else(|| SizeError::TooLarge(owned()))?;
    if value == 0 {
        return Err(SizeError::Zero(owned()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_binary_units() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("5GiB"), Ok(5 * (1 << 30)));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("800KB"), Ok(800_000));
        assert_eq!(parse_size("800kb"), Ok(800_000));
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size(" 2 MiB "), Ok(2 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("10TB"), Ok(10_000_000_000_000));
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "GB",
            "5XB",
            "-5GB",
            "0",
            "1.2.3GB",
            "99999999999999999999GB",
            "5 G B",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
        assert_eq!(parse_size("5XB"), Err(SizeError::UnknownUnit("5XB".into())));
        assert_eq!(parse_size("GB"), Err(SizeError::NoNumber("GB".into())));
        assert_eq!(parse_size("0"), Err(SizeError::Zero("0".into())));
    }
}

#[cfg(test)]
mod unit_hint_tests {
    use super::unit_hint;

    #[test]
    fn a_bare_small_number_gets_a_hint_and_a_unit_does_not() {
        assert!(unit_hint("100").is_some_and(|h| h.contains("did you mean 100MB")));
        assert!(unit_hint(" 512 ").is_some());
        assert_eq!(unit_hint("100MB"), None);
        assert_eq!(unit_hint("5000000000"), None);
        assert_eq!(unit_hint("1.5"), None);
    }
}
