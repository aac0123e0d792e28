//! Unit tests of the merge arithmetic and the factors' layout.
// Bit-exact comparisons are the point of these tests; matrix names follow the maths.
#![allow(clippy::float_cmp, clippy::many_single_char_names)]
use super::delta::*;
use super::factors::*;
use super::*;
use crate::model::merge::{Matrix, MergeKind};

/// The straightforward reference: delta in f64 from the definition, no streaming.
fn reference(b: &[f32], a: &[f32], out: usize, r: usize, inp: usize, scale: f32) -> Vec<f64> {
    let mut d = vec![0f64; out * inp];
    for i in 0..out {
        for j in 0..inp {
            let s: f64 = (0..r)
                .map(|k| f64::from(b[i * r + k]) * f64::from(a[k * inp + j]))
                .sum();
            d[i * inp + j] = s * f64::from(scale);
        }
    }
    d
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed * 97)
                % 2001;
            (x as f32 - 1000.0) / 333.0
        })
        .collect()
}

#[test]
fn the_delta_agrees_with_the_definition_within_f32_rounding() {
    let (out, r, inp) = (7, 3, 5);
    let (a, b) = (values(r * inp, 1), values(out * r, 2));
    let step = Loaded {
        kind: MergeKind::Linear {
            fan_in_fan_out: false,
            magnitude: None,
        },
        rank: r,
        p: b.clone(),
        q: a.clone(),
        q_block_rows: 0,
        magnitude: Vec::new(),
        scale: 0.5,
        rounded_products: false,
        panels: std::sync::OnceLock::new(),
    };
    let want = reference(&b, &a, out, r, inp, 0.5);
    let mut delta = vec![0f32; inp];
    for i in 0..out {
        row_delta(&step, i, &mut delta);
        for j in 0..inp {
            let w = want[i * inp + j];
            assert!(
                (f64::from(delta[j]) - w).abs() <= 4.0 * f64::from(f32::EPSILON) * w.abs().max(1.0),
                "[{i}][{j}]: {} vs {w}",
                delta[j]
            );
        }
    }
}

#[test]
fn the_rank_sum_is_sequential_fused_multiply_adds() {
    // 1 + 3e-8 rounds back to 1 (below half an ulp), twice; the exact sum
    // 1 + 6e-8 is above half an ulp and would round up.
    let step = Loaded {
        kind: MergeKind::Linear {
            fan_in_fan_out: false,
            magnitude: None,
        },
        rank: 3,
        p: vec![1.0, 1.0, 1.0],
        q: vec![1.0, 3e-8, 3e-8],
        q_block_rows: 0,
        magnitude: Vec::new(),
        scale: 1.0,
        rounded_products: false,
        panels: std::sync::OnceLock::new(),
    };
    let mut delta = vec![0f32; 1];
    row_delta(&step, 0, &mut delta);
    assert_eq!(delta[0], 1.0);
    let once = (1.0f64 + 2.0 * f64::from(3e-8f32)) as f32;
    assert!(once > 1.0, "the example must tell the two orders apart");
}

#[test]
fn a_one_row_delta_rounds_each_product_before_adding() {
    // p·q = (1 + 2⁻²³)(1 - 2⁻²⁴) = 1 + 2⁻²⁴ - 2⁻⁴⁷: a fused sum from -1 keeps
    // 2⁻²⁴ - 2⁻⁴⁷, the rounded product is 1 (round to even), so the sum is 0.
    let p = 1.0 + f32::EPSILON;
    let q = 1.0 - f32::EPSILON / 2.0;
    let step = |rounded_products| Loaded {
        kind: MergeKind::Linear {
            fan_in_fan_out: false,
            magnitude: None,
        },
        rank: 2,
        p: vec![1.0, p],
        q: vec![-1.0, q],
        q_block_rows: 0,
        magnitude: Vec::new(),
        scale: 1.0,
        rounded_products,
        panels: std::sync::OnceLock::new(),
    };
    let mut delta = vec![0f32; 1];
    row_delta(&step(true), 0, &mut delta);
    assert_eq!(delta[0], 0.0);
    row_delta(&step(false), 0, &mut delta);
    assert!(
        delta[0] > 0.0,
        "the fused sum keeps the low bits: {}",
        delta[0]
    );
}

#[test]
fn transposed_layouts_read_a_and_b_by_columns() {
    let (r, num, dim) = (2, 3, 4);
    let a = values(r * num, 3); // [r, num]
    let b = values(dim * r, 4); // [dim, r]
    let step = Loaded {
        kind: MergeKind::Embedding,
        rank: r,
        p: transpose(&a, r, num),
        q: transpose(&b, dim, r),
        q_block_rows: 0,
        magnitude: Vec::new(),
        scale: 1.0,
        rounded_products: false,
        panels: std::sync::OnceLock::new(),
    };
    let mut delta = vec![0f32; dim];
    for n in 0..num {
        row_delta(&step, n, &mut delta);
        for d in 0..dim {
            let want: f64 = (0..r)
                .map(|k| f64::from(b[d * r + k]) * f64::from(a[k * num + n]))
                .sum();
            assert!((f64::from(delta[d]) - want).abs() < 1e-5, "[{n}][{d}]");
        }
    }
}

#[test]
fn linear_rounds_once_and_embedding_twice() {
    // bf16 keeps 8 significant bits: next to 1 it steps by 2^-7, so 1 + 2^-8 is a
    // tie. A delta just above 2^-8 tips one rounding up, while rounding the delta
    // to bf16 first lands on the tie, which goes to even (1).
    let delta_value = 2f32.powi(-8) + 2f32.powi(-20);
    let step = |kind| Loaded {
        kind,
        rank: 1,
        p: vec![1.0],
        q: vec![delta_value],
        q_block_rows: 0,
        magnitude: Vec::new(),
        scale: 1.0,
        rounded_products: false,
        panels: std::sync::OnceLock::new(),
    };
    let mut scratch = [0f32; ROWS];
    let mut w = [1.0f32];
    let linear = MergeKind::Linear {
        fan_in_fan_out: false,
        magnitude: None,
    };
    apply_rows(&step(linear), (0, 1), &mut w, &mut scratch, DType::BF16);
    assert_eq!(w[0], 1.0 + 2f32.powi(-7));
    let mut e = [1.0f32];
    apply_rows(
        &step(MergeKind::Embedding),
        (0, 1),
        &mut e,
        &mut scratch,
        DType::BF16,
    );
    assert_eq!(e[0], 1.0);
}

/// Where a DoRA magnitude would be read from: these tests give its values directly.
fn unread_matrix() -> Matrix {
    Matrix {
        range: crate::types::range::ByteRange {
            file: 0,
            offset: 0,
            len: 0,
        },
        dtype: DType::F32,
        rows: 1,
        cols: 1,
    }
}

#[test]
fn dora_rescales_each_row_to_its_magnitude() {
    let step = Loaded {
        kind: MergeKind::Linear {
            fan_in_fan_out: false,
            magnitude: Some(unread_matrix()),
        },
        rank: 1,
        p: vec![1.0],
        q: vec![0.0, 1.0],
        q_block_rows: 0,
        magnitude: vec![10.0],
        scale: 1.0,
        rounded_products: false,
        panels: std::sync::OnceLock::new(),
    };
    let mut w = [3.0f32, 3.0];
    let mut scratch = [0f32; 2 * ROWS];
    apply_rows(&step, (0, 2), &mut w, &mut scratch, DType::F32);
    // W + delta = [3, 4], norm 5, magnitude 10: doubled.
    assert_eq!(w, [6.0, 8.0]);
}

/// The deltas of four rows at once are each row's own, bit for bit: for every
/// kind, dtype, a column count that is not a multiple of the lanes, a row count
/// that is not one of the rows at once, and experts' blocks that end mid-group.
#[test]
fn rows_at_once_equal_the_rows_one_by_one() {
    let rows = 11usize;
    let mut compared = 0;
    for (cols, rank) in [(1usize, 5usize), (7, 5), (16, 5), (37, 5), (64, 5), (37, 0)] {
        for q_block_rows in [0usize, 3] {
            let blocks = if q_block_rows == 0 {
                1
            } else {
                rows.div_ceil(3)
            };
            for kind in [
                MergeKind::Linear {
                    fan_in_fan_out: false,
                    magnitude: None,
                },
                MergeKind::Linear {
                    fan_in_fan_out: false,
                    magnitude: Some(unread_matrix()),
                },
                MergeKind::Embedding,
            ] {
                let step = Loaded {
                    kind,
                    rank,
                    p: values(rows * rank, 5),
                    q: values(blocks * rank * cols, 6),
                    q_block_rows,
                    magnitude: values(rows, 7).iter().map(|m| m.abs() + 1.0).collect(),
                    scale: 0.37,
                    rounded_products: false,
                    panels: std::sync::OnceLock::new(),
                };
                for dtype in [DType::BF16, DType::F16, DType::F32] {
                    let round = |x: f32| match dtype {
                        DType::BF16 => crate::save::cast::round_to_bf16(x),
                        DType::F16 => f16::from_f32(x).to_f32(),
                        _ => x,
                    };
                    let start: Vec<f32> = values(rows * cols, 8).into_iter().map(round).collect();
                    let mut one_by_one = start.clone();
                    let mut delta = vec![0f32; cols];
                    for (i, w) in one_by_one.chunks_exact_mut(cols).enumerate() {
                        apply_with(&step, i, w, &mut delta, round);
                    }
                    let mut together = start.clone();
                    // Scratch holds what an earlier tensor left: nothing may read it unwritten.
                    let mut scratch = vec![7.0f32; ROWS * cols];
                    apply_rows(&step, (0, cols), &mut together, &mut scratch, dtype);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&together),
                        bits(&one_by_one),
                        "{cols} columns, blocks of {q_block_rows}, {dtype:?}"
                    );
                    if rank > 0 {
                        assert_ne!(bits(&together), bits(&start), "the merge changed nothing");
                    }
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, 6 * 2 * 3 * 3);
}

/// A tensor holding every expert reads each row's factors from its own expert:
/// the same delta as the per-expert tensors, stacked.
#[test]
fn every_expert_in_one_tensor_is_the_per_expert_tensors_stacked() {
    let (experts, out, r, inp) = (3usize, 4usize, 2usize, 5usize);
    let lora_a = values(r * experts * inp, 3);
    let lora_b = values(out * r * experts, 4);
    let loaded = |factors: (Vec<f32>, Vec<f32>, usize)| Loaded {
        kind: MergeKind::Linear {
            fan_in_fan_out: false,
            magnitude: None,
        },
        rank: r,
        p: factors.0,
        q: factors.1,
        q_block_rows: factors.2,
        magnitude: Vec::new(),
        scale: 1.0,
        rounded_products: false,
        panels: std::sync::OnceLock::new(),
    };
    let all = loaded(
        expert_factors(
            &lora_a,
            &lora_b,
            (experts * out, inp, r),
            (None, experts as u64, 0),
        )
        .expect("fits"),
    );
    let mut stacked = vec![0f32; inp];
    let mut alone = vec![0f32; inp];
    for e in 0..experts {
        let one = loaded(
            expert_factors(
                &lora_a,
                &lora_b,
                (out, inp, r),
                (Some(e as u64), experts as u64, 0),
            )
            .expect("fits"),
        );
        for o in 0..out {
            row_delta(&all, e * out + o, &mut stacked);
            row_delta(&one, o, &mut alone);
            assert_eq!(stacked, alone, "expert {e}, row {o}");
            // And the definition: Σ_k B[o][k·E+e]·A[e·r+k].
            for j in 0..inp {
                let want: f32 = (0..r)
                    .map(|k| {
                        lora_b[o * r * experts + k * experts + e] * lora_a[(e * r + k) * inp + j]
                    })
                    .sum();
                assert!(
                    (alone[j] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{} vs {want}",
                    alone[j]
                );
            }
        }
    }
}
