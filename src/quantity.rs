//! Kubernetes resource quantities (`resource.Quantity`) as numbers: what capn compares and
//! renders from `500Mi`, `2G` or `1e3` (etcd's quota, a size's `GOMEMLIMIT` against its
//! memory limit). A leaf: it imports nothing of capn's, so the channel loader and the
//! planner can both use it.

/// The number of bytes a Kubernetes quantity stands for (`resource.Quantity`: a decimal
/// number with a binary suffix `Ki`…`Ei`, a decimal suffix `n`…`E` or an exponent `e3`),
/// rounded up to a whole byte as `Quantity.Value()` does. `None` for text that is not a
/// quantity, a negative one, or one above `u64::MAX`.
pub fn quantity_bytes(text: &str) -> Option<u64> {
    let text = text.strip_prefix('+').unwrap_or(text);
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    // The number as digits / 10^fraction_len, times the suffix as 2^binary · 10^decimal.
    let digits: u128 = format!("{whole}{fraction}").parse().ok()?;
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        exponent => {
            let exponent = exponent.strip_prefix(['e', 'E'])?;
            (0, exponent.parse().ok().filter(|e: &i32| e.abs() <= 30)?)
        }
    };
    let scale = decimal - i32::try_from(fraction.len()).ok()?;
    let mut value = digits.checked_mul(1u128.checked_shl(binary)?)?;
    if scale >= 0 {
        value = value.checked_mul(10u128.checked_pow(scale.unsigned_abs())?)?;
    } else {
        value = value.div_ceil(10u128.checked_pow(scale.unsigned_abs())?);
    }
    u64::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_convert_to_bytes_rounding_up() {
        for (text, bytes) in [
            ("1Gi", 1 << 30),
            ("500Mi", 500 << 20),
            ("1.5Gi", 3 << 29),
            ("2G", 2_000_000_000),
            ("8Mi", 8 << 20),
            ("1048576", 1 << 20),
            ("1e3", 1000),
            ("+4Ki", 4096),
            ("100m", 1),
            (".5Ki", 512),
            ("0", 0),
        ] {
            assert_eq!(quantity_bytes(text), Some(bytes), "{text}");
        }
        for text in ["", "-1Gi", "1Gb", "1..2", "Gi", "1 Gi", "99999999999Ei"] {
            assert_eq!(quantity_bytes(text), None, "{text}");
        }
    }
}
