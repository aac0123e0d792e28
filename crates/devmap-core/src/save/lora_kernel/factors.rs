//! An adapter's matrices read as f32 and laid out by the weight's rows: p (`rows ×
//! rank`) and q (`rank × cols`, one block per expert for a tensor of experts).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::delta::Loaded;
use super::widen;
use crate::model::merge::{Matrix, MergeKind, MergeStep};
use crate::types::DType;
use crate::types::range::FileId;

/// Reads a step's matrices as f32 and lays them out by the weight's rows.
pub(super) fn load(
    step: &MergeStep,
    rows: usize,
    cols: usize,
    open: &(dyn Fn(FileId) -> io::Result<File> + Sync),
) -> io::Result<Loaded> {
    let b = read_matrix(&step.b, open)?;
    let rank = step.rank as usize;
    let mut q_block_rows = 0;
    let mut rounded_products = false;
    let (p, q) = match (&step.kind, &step.a) {
        (MergeKind::Bias, _) => (Vec::new(), b),
        (
            &MergeKind::Expert {
                expert,
                experts,
                delta_row,
                transposed,
            },
            Some(a),
        ) => {
            let a = read_matrix(a, open)?;
            let factors = if transposed {
                transposed_expert_factors(&a, &b, (rows, cols, rank), experts)
            } else {
                expert_factors(&a, &b, (rows, cols, rank), (expert, experts, delta_row))
            };
            let Some((p, q, block)) = factors else {
                return Err(io::Error::other(
                    "an expert's LoRA slice lies outside its matrices",
                ));
            };
            q_block_rows = block;
            (p, q)
        }
        (kind, Some(a)) => {
            let a = read_matrix(a, open)?;
            let transposed = matches!(
                kind,
                MergeKind::Embedding
                    | MergeKind::Linear {
                        fan_in_fan_out: true,
                        ..
                    }
            );
            if transposed {
                // delta[i][j] = Σ_k A[k][i]·B[j][k]: p = Aᵀ (rows × r), q = Bᵀ (r × cols).
                // peft's `B @ A` has `cols` rows here.
                rounded_products = cols == 1;
                (transpose(&a, rank, rows), transpose(&b, cols, rank))
            } else {
                // delta[i][j] = Σ_k B[i][k]·A[k][j]: p = B (rows × r), q = A (r × cols).
                rounded_products = rows == 1;
                (b, a)
            }
        }
        (_, None) => return Err(io::Error::other("a LoRA step without its A matrix")),
    };
    let magnitude = match &step.kind {
        MergeKind::Linear {
            magnitude: Some(m), ..
        } => read_matrix(m, open)?,
        _ => Vec::new(),
    };
    Ok(Loaded {
        kind: step.kind.clone(),
        rank,
        p,
        q,
        q_block_rows,
        magnitude,
        scale: step.scale,
        rounded_products,
        panels: std::sync::OnceLock::new(),
    })
}

/// The factors of a LoRA on a fused experts parameter for the weight's rows (A
/// `[r·E, in]`, B `[out, r·E]`: expert e's delta is `Σ_k B[o][k·E+e]·A[e·r+k]`). For one
/// expert's tensor (`expert` given), its rows are delta rows `delta_row…`: p is
/// `rows × r`, q that expert's `r × cols` block of A. For a tensor that holds every
/// expert (`[E, out, in]`, rows E·out), row i is expert `i / out`'s delta row `i % out`:
/// q is all of A, and each row reads its expert's block (the returned block height,
/// `out` rows; 0 when q is one block).
pub(super) fn expert_factors(
    lora_a: &[f32],
    lora_b: &[f32],
    (rows, cols, rank): (usize, usize, usize),
    (expert, experts, delta_row): (Option<u64>, u64, u64),
) -> Option<(Vec<f32>, Vec<f32>, usize)> {
    let count = experts as usize;
    let wide = rank * count;
    let out = (lora_b.len() / wide.max(1)).max(1);
    // B's entries that multiply A's rows for delta row `row` of expert `e`.
    let b_row = |row: usize, e: usize| (0..rank).map(move |k| row * wide + k * count + e);
    let picked = |(row, e): (usize, usize)| b_row(row, e).map(|at| lora_b.get(at).copied());
    if let Some(e) = expert {
        let e = e as usize;
        let p = (0..rows)
            .map(|i| (delta_row as usize + i, e))
            .flat_map(picked)
            .collect::<Option<Vec<f32>>>()?;
        let q = lora_a.get(e * rank * cols..(e + 1) * rank * cols)?.to_vec();
        return Some((p, q, 0));
    }
    if lora_a.len() != count * rank * cols || rows != count * out {
        return None;
    }
    let p = (0..rows)
        .map(|i| (i % out, i / out))
        .flat_map(picked)
        .collect::<Option<Vec<f32>>>()?;
    let factors = (p, lora_a.to_vec(), out);
    Some(factors)
}

/// [`expert_factors`] for a tensor of every expert stored `[E, in, out]` (gpt-oss's,
/// and an MXFP4 weight dequantized): peft's delta is each expert's `(B·A)ᵀ`, so row
/// `i` (expert `i / in`, input `i % in`) is `Σ_k A[e·r+k][i % in] · B[:, k·E+e]`: p is
/// A's columns per row, q expert e's `r × out` block of B's columns (block height
/// `in` rows).
fn transposed_expert_factors(
    lora_a: &[f32],
    lora_b: &[f32],
    (rows, cols, rank): (usize, usize, usize),
    experts: u64,
) -> Option<(Vec<f32>, Vec<f32>, usize)> {
    let count = experts as usize;
    let wide = rank * count;
    if count == 0 || rows % count != 0 || lora_b.len() != cols * wide {
        return None;
    }
    let inputs = rows / count;
    if lora_a.len() != wide * inputs {
        return None;
    }
    let mut p = Vec::with_capacity(rows * rank);
    for i in 0..rows {
        let (e, input) = (i / inputs, i % inputs);
        p.extend((0..rank).map(|k| lora_a[(e * rank + k) * inputs + input]));
    }
    let mut q = Vec::with_capacity(count * rank * cols);
    for e in 0..count {
        for k in 0..rank {
            q.extend((0..cols).map(|o| lora_b[o * wide + k * count + e]));
        }
    }
    Some((p, q, inputs))
}

/// `m` (`r × c`, row-major) transposed.
pub(super) fn transpose(m: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = m[i * c + j];
        }
    }
    t
}

fn read_matrix(
    m: &Matrix,
    open: &(dyn Fn(FileId) -> io::Result<File> + Sync),
) -> io::Result<Vec<f32>> {
    if !matches!(m.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(io::Error::other(format!(
            "an adapter matrix is {}; devmap reads float32, float16 and bfloat16",
            m.dtype
        )));
    }
    let file = open(m.range.file)?;
    let mut bytes = vec![0u8; m.range.len as usize];
    file.read_exact_at(&mut bytes, m.range.offset)?;
    let mut values = vec![0f32; bytes.len() / m.dtype.size() as usize];
    widen(m.dtype, &bytes, &mut values);
    Ok(values)
}
