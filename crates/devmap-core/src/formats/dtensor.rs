//! Where a DTensor's local tensor lies in the whole tensor, as torch computes it
//! (`torch.distributed.tensor._utils.compute_local_shape_and_global_offset`): the
//! placements are applied in mesh-dimension order, each cutting what the ones before
//! left of a tensor dimension. `Shard(d)` cuts as `torch.chunk` does (chunks of
//! `ceil(n / size)`, the last ones shorter or empty); `_StridedShard(d, split_factor)`
//! (FSDP2 over tensor parallelism: the tensor-parallel cut made first) takes chunk `c`
//! of each of `split_factor` pieces, in order; `Replicate` does not cut.

/// How one mesh dimension places a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Shard(usize),
    Strided { dim: usize, split_factor: u64 },
    Replicate,
}

/// Runs of whole-tensor indices along one dimension, `(start, len)`, in the local
/// tensor's order.
type Runs = Vec<(u64, u64)>;

/// Where chunk `c` of `n` of a length `size` starts and ends, as `torch.chunk` cuts.
fn chunk(size: u64, n: u64, c: u64) -> (u64, u64) {
    let each = size.div_ceil(n.max(1));
    let from = c.saturating_mul(each).min(size);
    (from, from.saturating_add(each).min(size))
}

/// Positions `from..to` of the runs laid end to end.
fn select(runs: &Runs, from: u64, to: u64) -> Runs {
    let mut out = Runs::new();
    let mut at = 0u64;
    for &(start, len) in runs {
        let (lo, hi) = (from.max(at), to.min(at + len));
        if lo < hi {
            push(&mut out, (start + lo - at, hi - lo));
        }
        at += len;
    }
    out
}

/// Appends a run, joined to the last one where it follows on.
fn push(runs: &mut Runs, (start, len): (u64, u64)) {
    match runs.last_mut() {
        Some((s, l)) if *s + *l == start => *l += len,
        _ => runs.push((start, len)),
    }
}

fn total(runs: &Runs) -> u64 {
    runs.iter().map(|r| r.1).sum()
}

/// The block of a tensor of shape `whole` that the rank at `coordinate` on a mesh of
/// `sizes` holds under `placements` (one a mesh dimension): its offsets and shape; or,
/// in words, why it is not one block of the whole tensor.
pub fn block(
    whole: &[u64],
    sizes: &[u64],
    coordinate: &[u64],
    placements: &[Placement],
) -> Result<(Vec<u64>, Vec<u64>), String> {
    if sizes.len() != placements.len() || coordinate.len() != placements.len() {
        return Err(format!(
            "has {} placements on a mesh of {} dimensions",
            placements.len(),
            sizes.len()
        ));
    }
    let mut runs: Vec<Runs> = whole.iter().map(|&n| vec![(0, n)]).collect();
    for ((&place, &n), &c) in placements.iter().zip(sizes).zip(coordinate) {
        let dim = match place {
            Placement::Replicate => continue,
            Placement::Shard(d) | Placement::Strided { dim: d, .. } => d,
        };
        let Some(along) = runs.get(dim) else {
            return Err(format!(
                "is cut along dimension {dim} of a {}-dimensional tensor",
                whole.len()
            ));
        };
        let size = total(along);
        runs[dim] = if let Placement::Strided { split_factor, .. } = place {
            let piece = size.div_ceil(split_factor.max(1));
            let mut out = Runs::new();
            for s in 0..split_factor {
                let first = (s * piece).min(size);
                let len = (first + piece).min(size) - first;
                let (from, to) = chunk(len, n, c);
                for run in select(along, first + from, first + to) {
                    push(&mut out, run);
                }
            }
            out
        } else {
            let (from, to) = chunk(size, n, c);
            select(along, from, to)
        };
    }
    let mut offsets = Vec::with_capacity(whole.len());
    let mut shape = Vec::with_capacity(whole.len());
    for (dim, along) in runs.iter().enumerate() {
        match along.as_slice() {
            [] => {
                offsets.push(0);
                shape.push(0);
            }
            [(start, len)] => {
                offsets.push(*start);
                shape.push(*len);
            }
            more => {
                return Err(format!(
                    "holds {} separate runs of dimension {dim} here (a strided placement over uneven shards), not one block",
                    more.len()
                ));
            }
        }
    }
    Ok((offsets, shape))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Placement::{Replicate, Shard, Strided};

    #[test]
    fn torchs_examples() {
        // compute_local_shape_and_global_offset's docstring: [2, 5] on a 2×2 mesh,
        // (Shard(1), Shard(1)).
        let two = [Shard(1), Shard(1)];
        let got: Vec<_> = [[0, 0], [0, 1], [1, 0], [1, 1]]
            .iter()
            .map(|c| block(&[2, 5], &[2, 2], c, &two).expect("a block"))
            .collect();
        assert_eq!(
            got,
            [
                (vec![0, 0], vec![2, 2]),
                (vec![0, 2], vec![2, 1]),
                (vec![0, 3], vec![2, 1]),
                (vec![0, 4], vec![2, 1]),
            ]
        );
        // _StridedShard's docstring: [8, 8] on a 2×2 (dp, tp) mesh, FSDP2 over TP:
        // rank (0, 1) holds rows 4-5, rank (1, 0) rows 2-3.
        let fsdp_tp = [
            Strided {
                dim: 0,
                split_factor: 2,
            },
            Shard(0),
        ];
        let rows = |c: [u64; 2]| block(&[8, 8], &[2, 2], &c, &fsdp_tp).expect("a block");
        assert_eq!(rows([0, 0]), (vec![0, 0], vec![2, 8]));
        assert_eq!(rows([0, 1]), (vec![4, 0], vec![2, 8]));
        assert_eq!(rows([1, 0]), (vec![2, 0], vec![2, 8]));
        assert_eq!(rows([1, 1]), (vec![6, 0], vec![2, 8]));
        // Replicated on the second dimension; an empty last chunk.
        assert_eq!(
            block(&[3, 4], &[4, 2], &[3, 1], &[Shard(0), Replicate]),
            Ok((vec![0, 0], vec![0, 4]))
        );
    }

    #[test]
    fn what_is_not_one_block_is_said() {
        // 2 pieces of 3 rows over 2 ranks: rank 0 holds rows 0-1 and 3-4.
        let err = block(
            &[6],
            &[2],
            &[0],
            &[Strided {
                dim: 0,
                split_factor: 2,
            }],
        )
        .expect_err("two runs");
        assert!(err.contains("2 separate runs"), "{err}");
        assert!(block(&[6], &[2], &[0], &[Shard(3)]).is_err());
        assert!(block(&[6], &[2, 2], &[0], &[Shard(0)]).is_err());
    }
}
