use super::*;

/// The output of `part` of a weight, by `run`.
fn output(
    part: Fp8Part,
    file: &File,
    run: impl Fn(Fp8Input<'_>, &mut dyn FnMut(&[u8]) -> io::Result<()>),
) -> Vec<u8> {
    let len = file.metadata().expect("stat").len();
    let input = Fp8Input {
        name: "m.weight",
        weight: (
            file,
            ByteRange {
                file: 0,
                offset: 0,
                len,
            },
        ),
        layout: Fp8Out {
            rows: 256,
            cols: 384,
            block: (128, 128),
            from: DType::BF16,
            part,
        },
    };
    let mut out = Vec::new();
    run(input, &mut |b| {
        out.extend_from_slice(b);
        Ok(())
    });
    out
}

#[test]
fn scales_made_by_one_recipe_and_taken_by_the_other_change_nothing() {
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Each tile its own range (its row of tiles and column of tiles scale it).
    let weight: Vec<u8> = (0..256 * 384u32)
        .map(|i| {
            let (row, col) = (i / 384, i % 384);
            let tile = (row / 128 * 3 + col / 128 + 1) as f32;
            ((i * 7919) % 1000) as f32 / 97.0 * tile - 5.0
        })
        .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let mut file = tempfile::tempfile().expect("tmp");
    std::io::Write::write_all(&mut file, &weight).expect("written");
    let fresh = |part| {
        output(part, &file, |input, sink| {
            stream_bands(input, 0..2, (None, None), &stop, sink).expect("made");
        })
    };
    let cached = |part| {
        output(part, &file, |input, sink| {
            stream(input, &stop, sink).expect("made");
        })
    };
    let (values, scales) = (fresh(Fp8Part::Values), fresh(Fp8Part::Scales));
    assert_eq!(scales.len(), 2 * 3 * 4);
    // The values first (they keep the grid), then the scales (they take it) …
    assert_eq!(cached(Fp8Part::Values), values);
    assert_eq!(cached(Fp8Part::Scales), scales);
    // … and the other way round, as a shard lays them out.
    assert_eq!(cached(Fp8Part::Scales), scales);
    assert_eq!(cached(Fp8Part::Values), values);
    assert!(
        made::take(Fp8Input {
            name: "m.weight",
            weight: (
                &file,
                ByteRange {
                    file: 0,
                    offset: 0,
                    len: weight.len() as u64
                }
            ),
            layout: Fp8Out {
                rows: 256,
                cols: 384,
                block: (128, 128),
                from: DType::BF16,
                part: Fp8Part::Values
            },
        })
        .is_none(),
        "each grid is taken once"
    );
}

#[test]
fn every_finite_e4m3_value_rounds_to_itself_and_halfway_values_to_even() {
    let decode = super::super::fp8::e4m3_values();
    for code in 0..=255u8 {
        let v = decode[usize::from(code)];
        if v.is_nan() {
            continue;
        }
        assert_eq!(e4m3fn(v), code, "code {code:#04x} = {v}");
    }
    // Halfway between 1.0 (0x38) and 1.125 (0x39): to the even code, 0x38; between
    // 1.125 and 1.25 (0x3a): to 0x3a.
    assert_eq!(e4m3fn(1.0625), 0x38);
    assert_eq!(e4m3fn(1.1875), 0x3a);
    // Halfway in the subnormals: 1.5 · 2^-9 rounds to 2 · 2^-9.
    assert_eq!(e4m3fn(1.5 / 512.0), 0x02);
    assert_eq!(e4m3fn(-448.0), 0xfe);
}

/// The loops compiled for the CPU's vector units (`quantize_bf16`, `quantize_f32`,
/// `bf16_tile_maxima`) against the same steps one value at a time, outside them, over
/// every finite bfloat16 and tile scales that push values past ±448, into the
/// subnormals and onto rounding ties.
#[test]
fn the_vector_loops_match_the_steps_one_value_at_a_time() {
    let finite: Vec<u16> = (0..=u16::MAX).filter(|b| b & 0x7F80 != 0x7F80).collect();
    // 128-wide tiles of 8 columns' rows: the values in order, cut into rows.
    let (cols, bn) = (1024usize, 128usize);
    let rows = finite.len() / cols;
    let raw: Vec<u8> = finite[..rows * cols]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    let widened: Vec<f32> = finite[..rows * cols]
        .iter()
        .map(|&b| f32::from_bits(u32::from(b) << 16))
        .collect();
    for scales in [
        [1.0f32; 8],
        [448.0, 3.0e-3, 1.5, 7.0e5, 0.125, 2.0e-30, 1.0e30, 1.0 / 3.0],
    ] {
        let expected: Vec<u8> = widened
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let x = v * scales[(i % cols) / bn];
                e4m3fn(x.clamp(-FP8_MAX, FP8_MAX))
            })
            .collect();
        let mut out = vec![0u8; rows * cols];
        quantize_bf16(&raw, (cols, bn), &scales, &mut out);
        assert_eq!(out, expected, "bfloat16 rows, scales {scales:?}");
        out.fill(0);
        quantize_f32(&widened, (cols, bn), &scales, &mut out);
        assert_eq!(out, expected, "float32 rows, scales {scales:?}");
    }
    let mut maxes = [0u32; 8];
    assert!(!bf16_tile_maxima(&raw, (cols, bn), &mut maxes));
    for (tile, &max) in maxes.iter().enumerate() {
        let top = widened
            .chunks_exact(cols)
            .flat_map(|row| &row[tile * bn..][..bn])
            .map(|v| v.abs().to_bits())
            .max();
        assert_eq!(Some(max), top, "tile {tile}");
    }
    // A NaN anywhere is seen.
    let mut with_nan = raw.clone();
    with_nan[2 * 777..][..2].copy_from_slice(&0x7FC1u16.to_le_bytes());
    assert!(bf16_tile_maxima(&with_nan, (cols, bn), &mut [0u32; 8]));
}
