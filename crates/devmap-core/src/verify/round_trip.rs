//! `--against SRC --quantize fp8-block`: how far each weight written as FP8 lies from
//! its source. The bytes are checked against the saver's recipe like any other (a
//! copy check); this check reads the written values and scales back, dequantizes them
//! (`q · weight_scale_inv`, as transformers' FP8 integration does) and measures each
//! value's error against the bound FP8 E4M3's rounding allows: half a step of E4M3 at
//! the value's scaled magnitude (`2^(e−4)` for `|w·s|` in `[2^e, 2^(e+1))`, `2^−10`
//! below the smallest normal), divided by the tile's scale. The outcome is a bound,
//! not a difference: one note for the checkpoint (the largest error as a fraction of
//! its bound, and the largest relative error), and a difference for a value past it.

use std::collections::HashMap;
use std::fs::File;

use super::against::SaveReference;
use super::report::{Finding, Kind};
use super::written::{Written, WrittenTensor};
use crate::save::copy::read_exact_at;
use crate::save::execute::{Make, Read};
use crate::save::quantize_fp8::Fp8Part;
use crate::save::shards::PlannedTensor;
use crate::types::DType;

/// Past this fraction of its bound a value is a difference: the f32 roundings of the
/// scale, its inverse and the products sit far below it.
const SLACK: f64 = 1.0 + 1.0 / 65536.0;

/// The largest errors seen over the weights checked.
#[derive(Default)]
struct Worst {
    weights: usize,
    /// Largest `error / bound`, and where.
    of_bound: (f64, String),
    /// Largest `error / |w|` over values at least a normal E4M3 step from zero.
    relative: f64,
}

/// Measures every weight `pairs` quantizes; findings as the module says.
pub(super) fn check(
    written: &Written,
    expected: &SaveReference,
    pairs: &[(usize, &PlannedTensor)],
    findings: &mut Vec<Finding>,
) {
    let ckpt = expected.ckpt;
    let mut worst = Worst::default();
    // Made on the first quantized weight: the written tensors by name, and each file
    // opened once (a checkpoint's weights share a few shards and sources).
    let mut by_name: Option<HashMap<&str, &WrittenTensor>> = None;
    let mut sources: HashMap<usize, Option<File>> = HashMap::new();
    let mut shards: HashMap<usize, Option<File>> = HashMap::new();
    for (i, p) in pairs {
        let recipe = p.recipe(ckpt);
        let (Make::Quantize(layout), Read::Range(range)) = (recipe.make, recipe.read) else {
            continue;
        };
        if layout.part != Fp8Part::Values {
            continue;
        }
        let values = &written.tensors[*i];
        let by_name = by_name.get_or_insert_with(|| {
            written
                .tensors
                .iter()
                .map(|t| (t.name.as_str(), t))
                .collect()
        });
        let Some(&scales) = by_name.get(format!("{}_scale_inv", values.name).as_str()) else {
            continue; // reported missing by the name checks
        };
        let source = sources.entry(range.file).or_insert_with(|| {
            crate::formats::input::open_regular(ckpt.file_path(range.file)).ok()
        });
        for shard in [values.shard, scales.shard] {
            shards
                .entry(shard)
                .or_insert_with(|| File::open(&written.shards[shard].path).ok());
        }
        let (Some(source), Some(Some(values_file)), Some(Some(scales_file))) = (
            source.as_ref(),
            shards.get(&values.shard),
            shards.get(&scales.shard),
        ) else {
            continue; // unreadable files are reported by the byte checks
        };
        let weight = Weight {
            source: (source, range.offset, layout.from),
            values: (values_file, values),
            scales: (scales_file, scales),
            rows: layout.rows as usize,
            cols: layout.cols as usize,
            block: (layout.block.0 as usize, layout.block.1 as usize),
        };
        match weight.measure() {
            Ok(Measured::Within { of_bound, relative }) => {
                worst.weights += 1;
                if of_bound > worst.of_bound.0 {
                    worst.of_bound = (of_bound, values.name.clone());
                }
                worst.relative = worst.relative.max(relative);
            }
            Ok(Measured::Past(message)) => {
                findings.push(Finding::difference(Kind::Content, &values.name, message));
            }
            Err(_) => {} // a short read is reported by the byte checks
        }
    }
    if worst.weights > 0 {
        findings.push(Finding::note(
            Kind::RoundTrip,
            "fp8-block",
            format!(
                "{}: every value within half an E4M3 step of its source (largest error {:.3} of that bound, in `{}`; largest relative error {:.2}%)",
                crate::text::count(worst.weights, "weight quantized", "weights quantized"),
                worst.of_bound.0,
                worst.of_bound.1,
                worst.relative * 100.0
            ),
        ));
    }
}

/// What a weight's round trip came to.
enum Measured {
    Within { of_bound: f64, relative: f64 },
    Past(String),
}

/// A quantized weight's three inputs: its source (file, offset, dtype), and the
/// written values and tile scales.
struct Weight<'a> {
    source: (&'a File, u64, DType),
    values: (&'a File, &'a WrittenTensor),
    scales: (&'a File, &'a WrittenTensor),
    rows: usize,
    cols: usize,
    block: (usize, usize),
}

impl Weight<'_> {
    /// Every value's error, a row of tiles at a time.
    fn measure(&self) -> Result<Measured, crate::save::copy::CopyError> {
        let (rows, cols, (bm, bn)) = (self.rows, self.cols, self.block);
        let tiles = cols / bn;
        let (src_file, src_offset, from) = self.source;
        let size = from.size() as usize;
        let decode = crate::save::fp8::e4m3_values();
        let (mut raw, mut wide, mut codes, mut scale_bytes) =
            (Vec::new(), Vec::new(), Vec::new(), vec![0u8; tiles * 4]);
        let (mut of_bound, mut relative) = (0f64, 0f64);
        for band in 0..rows / bm {
            let first = band * bm;
            raw.resize(bm * cols * size, 0);
            read_exact_at(
                src_file,
                &mut raw,
                src_offset + (first * cols * size) as u64,
            )?;
            wide.resize(bm * cols * 4, 0);
            crate::save::cast::cast(from, DType::F32, &raw, &mut wide);
            codes.resize(bm * cols, 0);
            let (vf, vt) = self.values;
            read_exact_at(vf, &mut codes, vt.offset + (first * cols) as u64)?;
            let (sf, st) = self.scales;
            read_exact_at(sf, &mut scale_bytes, st.offset + (band * tiles * 4) as u64)?;
            for (k, (w, &q)) in wide.chunks_exact(4).zip(&codes).enumerate() {
                let w = f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                let t = (k % cols) / bn;
                let s_inv = &scale_bytes[t * 4..t * 4 + 4];
                let s_inv = f64::from(f32::from_le_bytes([s_inv[0], s_inv[1], s_inv[2], s_inv[3]]));
                let back = f64::from(decode[usize::from(q)]) * s_inv;
                let error = (w - back).abs();
                let bound = half_step(w / s_inv) * s_inv;
                let ratio = if bound > 0.0 { error / bound } else { 0.0 };
                if ratio.is_nan() || ratio > SLACK {
                    let element = (first + k / cols) * cols + k % cols;
                    return Ok(Measured::Past(format!(
                        "element {element}: the source holds {w}, the FP8 value times its scale is {back}: off by {ratio:.2} of half an E4M3 step (the rounding allows one)"
                    )));
                }
                of_bound = of_bound.max(ratio);
                if (w / s_inv).abs() >= 1.0 / 64.0 {
                    relative = relative.max(error / w.abs());
                }
            }
        }
        Ok(Measured::Within { of_bound, relative })
    }
}

/// Half a step of FP8 E4M3 at `x` (a value already scaled into its range): `2^(e−4)`
/// for `|x|` in `[2^e, 2^(e+1))`, `2^−10` below the smallest normal `2^−6`.
fn half_step(x: f64) -> f64 {
    let a = x.abs();
    if a < 1.0 / 64.0 {
        return 1.0 / 1024.0;
    }
    let e = a.log2().floor();
    (e - 4.0).exp2()
}

#[cfg(test)]
mod tests {
    #[test]
    fn half_steps_follow_e4m3s_spacing() {
        // Powers of two, compared exactly.
        let is =
            |x: f64, want: f64| assert_eq!(super::half_step(x).to_bits(), want.to_bits(), "{x}");
        // 1.0 and 1.125 are neighbours (3 mantissa bits): half a step is 1/16.
        is(1.0, 1.0 / 16.0);
        is(-1.9, 1.0 / 16.0);
        // 256 to 448: steps of 32.
        is(448.0, 16.0);
        // Subnormals: steps of 2^-9.
        is(0.001, 1.0 / 1024.0);
    }
}
