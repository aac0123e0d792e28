//! Tensors stored in pieces: a training run's ranks each save the block of a tensor
//! they hold (torch.distributed.checkpoint's chunks, transformers 5's rank files).
//! A piece is a row-major block of the whole tensor — its `offsets` and `sizes` along
//! every dimension — stored contiguously in one byte range.
//!
//! Writing the whole tensor means copying each piece's *runs*: the stretches of the
//! piece that are also contiguous in the whole tensor. A piece split along dimension
//! 0 only is one run; a piece split along dimension `j` is one run per index of the
//! dimensions before `j`. [`runs`] gives them in the whole tensor's order, so a writer
//! (or a hash) sees the tensor front to back without holding any of it.
//!
//! Pieces of one dimension for a tensor of several are blocks of its flattened
//! elements (DeepSpeed ZeRO partitions each parameter so).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::range::ByteRange;

/// One stored block of a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Where the block's elements are, row-major.
    pub range: ByteRange,
    /// The block's first index along each dimension of the whole tensor.
    pub offsets: Box<[u64]>,
    /// The block's extent along each dimension.
    pub sizes: Box<[u64]>,
    /// How the block's elements lie in `range`, in elements per step of each
    /// dimension, when not row-major one after another: a view `torch.save` kept as
    /// its storage and strides (a transposed weight, a slice of a wider one). Such a
    /// block is gathered through memory, never copied by runs.
    pub stride: Option<Box<[u64]>>,
}

impl Piece {
    pub fn numel(&self) -> u64 {
        self.sizes.iter().product()
    }
}

/// One stretch of a piece that is contiguous in the whole tensor too, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Index of the piece.
    pub piece: usize,
    /// Offset in the piece's file.
    pub from: u64,
    /// Offset in the whole tensor.
    pub to: u64,
    pub len: u64,
}

/// Why pieces do not make up a tensor exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tiling {
    /// A piece reaches past the tensor, or has another number of dimensions.
    OutOfBounds { piece: usize },
    /// Two pieces hold some of the same elements.
    Overlap { pieces: (usize, usize) },
    /// Elements no piece holds: the first missing one's index, how many follow it
    /// without a gap's end, and how many are missing in all.
    Gap {
        first: Vec<u64>,
        run: u64,
        missing: u64,
    },
}

impl std::fmt::Display for Tiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tiling::OutOfBounds { piece } => {
                write!(f, "chunk {piece} reaches outside the tensor's size")
            }
            Tiling::Overlap { pieces: (a, b) } => {
                write!(
                    f,
                    "chunks {a} and {b} overlap (both hold some of the same elements)"
                )
            }
            Tiling::Gap {
                first,
                run,
                missing,
            } => write!(
                f,
                "{missing} of its elements are in no chunk: the first missing one is at index {first:?} ({run} missing from there on)"
            ),
        }
    }
}

/// The shape pieces are blocks of: the tensor's, or its flattened one when every piece
/// has one dimension and the tensor has another number.
pub fn blocks_of(shape: &[u64], pieces: &[Piece]) -> Vec<u64> {
    let flat = shape.len() != 1
        && !pieces.is_empty()
        && pieces
            .iter()
            .all(|p| p.offsets.len() == 1 && p.sizes.len() == 1);
    if flat {
        vec![shape.iter().product()]
    } else {
        shape.to_vec()
    }
}

/// Checks that `pieces` lie inside a tensor of `shape` and hold no element twice: the
/// blocks one rank of a sharded job holds, the others holding the rest.
pub fn held_apart(shape: &[u64], pieces: &[Piece]) -> Result<(), Tiling> {
    match tiling(shape, pieces) {
        Ok(()) | Err(Tiling::Gap { .. }) => Ok(()),
        Err(problem) => Err(problem),
    }
}

/// Checks that `pieces` hold every element of a tensor of `shape` exactly once.
pub fn tiling(shape: &[u64], pieces: &[Piece]) -> Result<(), Tiling> {
    let shape = &blocks_of(shape, pieces)[..];
    for (i, p) in pieces.iter().enumerate() {
        let inside = p.offsets.len() == shape.len()
            && p.sizes.len() == shape.len()
            && p.offsets
                .iter()
                .zip(&p.sizes)
                .zip(shape)
                .all(|((&o, &s), &n)| o.checked_add(s).is_some_and(|end| end <= n));
        if !inside {
            return Err(Tiling::OutOfBounds { piece: i });
        }
    }
    if let Some(overlap) = overlapping(pieces) {
        return Err(Tiling::Overlap { pieces: overlap });
    }
    let total: u64 = shape.iter().product();
    let held: u64 = pieces.iter().map(Piece::numel).sum();
    if held == total {
        return Ok(());
    }
    // In bounds, no overlap, fewer elements: a gap. Walk the runs to name where.
    let mut cursor = 0u64;
    let mut gap = None;
    for run in runs(shape, 1, pieces) {
        if run.to > cursor {
            gap = Some((cursor, run.to - cursor));
            break;
        }
        cursor = run.to + run.len;
    }
    let (start, run) = gap.unwrap_or((cursor, total - cursor));
    Err(Tiling::Gap {
        first: index_of(shape, start),
        run,
        missing: total - held,
    })
}

/// The first pair of pieces holding a common element. Pieces that differ along one
/// dimension only (a tensor split along one dimension, the usual case) are checked in
/// order of their offset there; others pair by pair.
fn overlapping(pieces: &[Piece]) -> Option<(usize, usize)> {
    let nonempty: Vec<usize> = (0..pieces.len())
        .filter(|&i| pieces[i].numel() > 0)
        .collect();
    let first = nonempty.first().map(|&i| &pieces[i])?;
    let varying: Vec<usize> = (0..first.offsets.len())
        .filter(|&d| {
            nonempty.iter().any(|&i| {
                pieces[i].offsets[d] != first.offsets[d] || pieces[i].sizes[d] != first.sizes[d]
            })
        })
        .collect();
    if let [d] = varying[..] {
        let mut sorted = nonempty;
        sorted.sort_by_key(|&i| pieces[i].offsets[d]);
        return sorted.windows(2).find_map(|w| {
            let (a, b) = (&pieces[w[0]], &pieces[w[1]]);
            (a.offsets[d] + a.sizes[d] > b.offsets[d]).then_some((w[0], w[1]))
        });
    }
    for (k, &a) in nonempty.iter().enumerate() {
        for &b in &nonempty[k + 1..] {
            let (p, q) = (&pieces[a], &pieces[b]);
            let meet = (0..p.offsets.len()).all(|d| {
                p.offsets[d] < q.offsets[d] + q.sizes[d] && q.offsets[d] < p.offsets[d] + p.sizes[d]
            });
            if meet {
                return Some((a.min(b), a.max(b)));
            }
        }
    }
    None
}

/// The multi-index of element `at` of a row-major tensor of `shape`.
fn index_of(shape: &[u64], mut at: u64) -> Vec<u64> {
    let mut index = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        if shape[d] > 0 {
            index[d] = at % shape[d];
            at /= shape[d];
        }
    }
    index
}

/// The fewest elements a run of `pieces` holds (pieces of a tensor of `shape`): the
/// length of every run but for empty pieces. `u64::MAX` when there is no run.
pub fn shortest_run(shape: &[u64], pieces: &[Piece]) -> u64 {
    let shape = blocks_of(shape, pieces);
    pieces
        .iter()
        .enumerate()
        .map(|(i, p)| PieceRuns::new(i, p, &shape, 1))
        .filter(|w| w.count > 0)
        .map(|w| w.run)
        .min()
        .unwrap_or(u64::MAX)
}

/// The runs of `pieces` (of a tensor of `shape`, `elem` bytes an element) in the whole
/// tensor's order. Memory is a few words per piece, whatever the tensor's size.
pub fn runs<'a>(shape: &[u64], elem: u64, pieces: &'a [Piece]) -> impl Iterator<Item = Run> + 'a {
    let shape = blocks_of(shape, pieces);
    let mut walks: Vec<PieceRuns> = pieces
        .iter()
        .enumerate()
        .map(|(i, p)| PieceRuns::new(i, p, &shape, elem))
        .collect();
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    for (i, w) in walks.iter_mut().enumerate() {
        if let Some(run) = w.peek() {
            heap.push(Reverse((run.to, i)));
        }
    }
    std::iter::from_fn(move || {
        if let [only] = &mut walks[..] {
            // One piece (a window's block): its own order, no merge.
            let run = only.peek()?;
            only.advance();
            return Some(run);
        }
        let Reverse((_, i)) = heap.pop()?;
        let run = walks[i].peek()?;
        walks[i].advance();
        if let Some(next) = walks[i].peek() {
            heap.push(Reverse((next.to, i)));
        }
        Some(run)
    })
}

/// The runs of one piece, in order.
struct PieceRuns<'a> {
    index: usize,
    piece: &'a Piece,
    /// Elements after dimension `d` in the whole tensor, for each `d`.
    strides: Vec<u64>,
    /// The dimension a run spans (the last one the piece does not cover whole), and
    /// the run's length in elements.
    dim: usize,
    run: u64,
    /// Runs in all, and which one is next; `at` holds its index over the dimensions
    /// before `dim`.
    count: u64,
    next: u64,
    at: Vec<u64>,
    elem: u64,
}

impl<'a> PieceRuns<'a> {
    fn new(index: usize, piece: &'a Piece, shape: &[u64], elem: u64) -> PieceRuns<'a> {
        let n = shape.len();
        let mut strides = vec![1u64; n];
        for d in (0..n.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let dim = (0..n)
            .rev()
            .find(|&d| piece.sizes[d] != shape[d])
            .unwrap_or(0);
        let run = if n == 0 {
            1
        } else {
            piece.sizes[dim] * strides[dim]
        };
        let count = if piece.numel() == 0 {
            0
        } else {
            piece.sizes[..dim].iter().product()
        };
        PieceRuns {
            index,
            piece,
            strides,
            dim,
            run,
            count,
            next: 0,
            at: vec![0; dim],
            elem,
        }
    }

    fn peek(&self) -> Option<Run> {
        if self.next >= self.count {
            return None;
        }
        let p = self.piece;
        let mut to = if self.strides.is_empty() {
            0
        } else {
            p.offsets[self.dim] * self.strides[self.dim]
        };
        for (d, &i) in self.at.iter().enumerate() {
            to += (p.offsets[d] + i) * self.strides[d];
        }
        Some(Run {
            piece: self.index,
            from: p.range.offset + self.next * self.run * self.elem,
            to: to * self.elem,
            len: self.run * self.elem,
        })
    }

    fn advance(&mut self) {
        self.next += 1;
        for d in (0..self.dim).rev() {
            self.at[d] += 1;
            if self.at[d] < self.piece.sizes[d] {
                return;
            }
            self.at[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(file: usize, offset: u64, offsets: &[u64], sizes: &[u64]) -> Piece {
        Piece {
            stride: None,
            range: ByteRange {
                file,
                offset,
                len: sizes.iter().product::<u64>(),
            },
            offsets: offsets.into(),
            sizes: sizes.into(),
        }
    }

    /// The whole tensor assembled from pieces by their runs, each element named by the
    /// piece and its position there, against the same built element by element.
    fn assemble(shape: &[u64], pieces: &[Piece]) -> Vec<(usize, u64)> {
        let total: u64 = shape.iter().product();
        let mut out = vec![(usize::MAX, 0); total as usize];
        let mut last_end = 0;
        for run in runs(shape, 1, pieces) {
            assert!(run.to >= last_end, "runs come in order");
            last_end = run.to + run.len;
            for k in 0..run.len {
                out[(run.to + k) as usize] =
                    (run.piece, run.from + k - pieces[run.piece].range.offset);
            }
        }
        out
    }

    fn by_element(shape: &[u64], pieces: &[Piece]) -> Vec<(usize, u64)> {
        let total: u64 = shape.iter().product();
        (0..total)
            .map(|e| {
                let at = index_of(shape, e);
                pieces
                    .iter()
                    .enumerate()
                    .find_map(|(i, p)| {
                        let local: Option<Vec<u64>> = at
                            .iter()
                            .zip(p.offsets.iter().zip(p.sizes.iter()))
                            .map(|(&x, (&o, &s))| (x >= o && x < o + s).then(|| x - o))
                            .collect();
                        let local = local?;
                        let flat = local
                            .iter()
                            .zip(p.sizes.iter())
                            .fold(0, |acc, (&x, &s)| acc * s + x);
                        Some((i, flat))
                    })
                    .unwrap_or((usize::MAX, 0))
            })
            .collect()
    }

    #[test]
    fn a_split_along_dim_0_is_one_run_per_piece_uneven_too() {
        let pieces = [
            piece(0, 100, &[0, 0], &[19, 4]),
            piece(1, 7, &[19, 0], &[18, 4]),
        ];
        assert_eq!(tiling(&[37, 4], &pieces), Ok(()));
        let all: Vec<Run> = runs(&[37, 4], 2, &pieces).collect();
        assert_eq!(
            all,
            [
                Run {
                    piece: 0,
                    from: 100,
                    to: 0,
                    len: 19 * 4 * 2
                },
                Run {
                    piece: 1,
                    from: 7,
                    to: 19 * 4 * 2,
                    len: 18 * 4 * 2
                },
            ]
        );
    }

    #[test]
    fn a_split_along_dim_1_interleaves_rows() {
        let pieces = [piece(0, 0, &[0, 0], &[3, 2]), piece(1, 0, &[0, 2], &[3, 3])];
        assert_eq!(tiling(&[3, 5], &pieces), Ok(()));
        let all: Vec<(usize, u64, u64)> = runs(&[3, 5], 1, &pieces)
            .map(|r| (r.piece, r.to, r.len))
            .collect();
        assert_eq!(
            all,
            [
                (0, 0, 2),
                (1, 2, 3),
                (0, 5, 2),
                (1, 7, 3),
                (0, 10, 2),
                (1, 12, 3)
            ]
        );
        assert_eq!(assemble(&[3, 5], &pieces), by_element(&[3, 5], &pieces));
    }

    #[test]
    fn a_two_dimensional_grid_of_three_dimensional_pieces() {
        let shape = [4, 6, 5];
        let mut pieces = Vec::new();
        for (i, (o0, s0)) in [(0, 1), (1, 3)].into_iter().enumerate() {
            for (j, (o1, s1)) in [(0, 4), (4, 2)].into_iter().enumerate() {
                pieces.push(piece(i * 2 + j, 10, &[o0, o1, 0], &[s0, s1, 5]));
            }
        }
        assert_eq!(tiling(&shape, &pieces), Ok(()));
        assert_eq!(assemble(&shape, &pieces), by_element(&shape, &pieces));
    }

    #[test]
    fn one_dimensional_pieces_are_blocks_of_the_flattened_tensor() {
        // A 3×4 parameter partitioned over two ranks ZeRO-3's way: 6 elements each.
        let pieces = [piece(0, 40, &[0], &[6]), piece(1, 8, &[6], &[6])];
        assert_eq!(tiling(&[3, 4], &pieces), Ok(()));
        let all: Vec<(usize, u64, u64, u64)> = runs(&[3, 4], 4, &pieces)
            .map(|r| (r.piece, r.from, r.to, r.len))
            .collect();
        assert_eq!(all, [(0, 40, 0, 24), (1, 8, 24, 24)]);
        assert_eq!(
            tiling(&[3, 4], &pieces[..1]),
            Err(Tiling::Gap {
                first: vec![6],
                run: 6,
                missing: 6
            })
        );
    }

    #[test]
    fn scalars_empty_pieces_and_a_whole_piece() {
        assert_eq!(tiling(&[], &[piece(0, 4, &[], &[])]), Ok(()));
        assert_eq!(runs(&[], 4, &[piece(0, 4, &[], &[])]).count(), 1);
        let pieces = [piece(0, 0, &[0, 0], &[0, 3]), piece(1, 0, &[0, 0], &[2, 3])];
        assert_eq!(tiling(&[2, 3], &pieces), Ok(()));
        assert_eq!(runs(&[2, 3], 1, &pieces).count(), 1);
    }

    #[test]
    fn gaps_overlaps_and_strays_are_named() {
        let gap = [piece(0, 0, &[0, 0], &[2, 4]), piece(1, 0, &[3, 0], &[2, 4])];
        assert_eq!(
            tiling(&[5, 4], &gap),
            Err(Tiling::Gap {
                first: vec![2, 0],
                run: 4,
                missing: 4
            })
        );
        let tail = [piece(0, 0, &[0, 0], &[3, 2]), piece(1, 0, &[0, 2], &[3, 2])];
        assert_eq!(
            tiling(&[3, 5], &tail),
            Err(Tiling::Gap {
                first: vec![0, 4],
                run: 1,
                missing: 3
            })
        );
        let overlap = [piece(0, 0, &[0, 0], &[3, 4]), piece(1, 0, &[2, 0], &[3, 4])];
        assert_eq!(
            tiling(&[5, 4], &overlap),
            Err(Tiling::Overlap { pieces: (0, 1) })
        );
        let grid_overlap = [piece(0, 0, &[0, 0], &[2, 2]), piece(1, 0, &[1, 1], &[2, 2])];
        assert_eq!(
            tiling(&[3, 3], &grid_overlap),
            Err(Tiling::Overlap { pieces: (0, 1) })
        );
        assert_eq!(
            tiling(&[5, 4], &[piece(0, 0, &[4, 0], &[2, 4])]),
            Err(Tiling::OutOfBounds { piece: 0 })
        );
        assert_eq!(
            tiling(&[5, 4], &[piece(0, 0, &[0, 0, 0], &[5, 4, 1])]),
            Err(Tiling::OutOfBounds { piece: 0 })
        );
    }

    proptest::proptest! {
        /// Any grid of cuts along any dimensions tiles the tensor, and the runs put
        /// every element where element-by-element placement does.
        #[test]
        fn any_grid_assembles_as_element_by_element(
            shape in proptest::collection::vec(1u64..6, 1..4),
            cuts in proptest::collection::vec(proptest::collection::vec(0u64..6, 0..3), 3),
            drop in proptest::option::of(0usize..64),
        ) {
            // Per dimension, the sorted distinct cut points inside it.
            let bounds: Vec<Vec<u64>> = shape.iter().zip(&cuts).map(|(&n, c)| {
                let mut b: Vec<u64> = c.iter().map(|&x| x % n).filter(|&x| x > 0).collect();
                b.push(0);
                b.push(n);
                b.sort_unstable();
                b.dedup();
                b
            }).collect();
            let mut pieces = vec![Vec::<(u64, u64)>::new()];
            for b in &bounds {
                pieces = pieces.into_iter().flat_map(|prefix| {
                    b.windows(2).map(move |w| {
                        let mut p = prefix.clone();
                        p.push((w[0], w[1] - w[0]));
                        p
                    }).collect::<Vec<_>>()
                }).collect();
            }
            let mut pieces: Vec<Piece> = pieces.iter().enumerate().map(|(i, dims)| {
                let offsets: Vec<u64> = dims.iter().map(|d| d.0).collect();
                let sizes: Vec<u64> = dims.iter().map(|d| d.1).collect();
                piece(i, 3, &offsets, &sizes)
            }).collect();
            // Pieces listed in any order.
            pieces.reverse();
            proptest::prop_assert_eq!(tiling(&shape, &pieces), Ok(()));
            proptest::prop_assert_eq!(assemble(&shape, &pieces), by_element(&shape, &pieces));
            if let Some(k) = drop.filter(|_| pieces.len() > 1) {
                let k = k % pieces.len();
                let gone = pieces.remove(k);
                let is_gap = matches!(tiling(&shape, &pieces), Err(Tiling::Gap { missing, .. }) if missing == gone.numel());
                proptest::prop_assert!(is_gap);
            }
        }
    }
}
