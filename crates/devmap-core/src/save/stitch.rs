//! A tensor stored in pieces (a training run's ranks each saved a block of it) written
//! whole: each piece's runs — the stretches contiguous in the whole tensor too, see
//! `types::pieces` — copied into place in the whole tensor's order, with
//! `copy_file_range` where the kernel can, or cast through the copier's fixed buffer.
//! A tensor split along its first dimension is one run per piece, copied as it is.
//! Split along a later one, a run is a row of the piece — too short to copy one by one
//! (a million 512-byte copies made a 1 GB save 20× slower than `cp`) — so the tensor
//! is assembled a window of whole rows at a time instead: each piece's share of the
//! window read in one read (contiguous in the piece), its runs placed in the window in
//! memory, the window written (or cast) in one write. Memory stays a few fixed
//! buffers, whatever the tensor's size or the number of pieces.

use std::collections::HashMap;
use std::fs::File;

use super::copy::{Copier, CopyError, Stop};
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::types::DType;
use crate::types::pieces::{Piece, Run};
use crate::types::range::FileId;

/// A copy that failed, with the piece's file it was reading.
pub struct Failed {
    pub error: CopyError,
    pub file: FileId,
}

/// Where the tensor's bytes go.
pub enum Sink<'a> {
    /// Into a file at an offset, converted from the first dtype to the second.
    File {
        at: (&'a File, u64),
        dtypes: (DType, DType),
        report: &'a mut dyn FnMut(u64),
    },
    /// To a reader of every byte in order (verify's hash), cast when given.
    Stream {
        cast: Option<(DType, DType)>,
        feed: &'a mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    },
}

/// Moves tensor `id`, stored in pieces `index`, to `sink`, run by run in the whole
/// tensor's order. `open` gives a piece's file; each is opened once.
pub fn put_together(
    ckpt: &Checkpoint,
    (id, index): (TensorId, u32),
    open: &mut dyn FnMut(FileId) -> Result<File, CopyError>,
    copier: &mut Copier,
    sink: Sink<'_>,
    stop: &dyn Stop,
) -> Result<(), Failed> {
    let tensor = &ckpt.tensors()[id];
    let shape = tensor.shape.to_vec();
    let pieces = ckpt.pieces(index);
    let mut files: HashMap<FileId, File> = HashMap::new();
    let mut sink = sink;
    let elem = tensor.dtype.size();
    let blocks = crate::types::pieces::blocks_of(&shape, pieces);
    let row_bytes = blocks.iter().skip(1).product::<u64>() * elem;
    let short = crate::types::pieces::shortest_run(&shape, pieces).saturating_mul(elem) < LONG_RUN;
    let strided = pieces.iter().any(|p| p.stride.is_some());
    if strided || (short && row_bytes > 0 && row_bytes <= WINDOW as u64) {
        for p in pieces {
            let file = p.range.file;
            if let std::collections::hash_map::Entry::Vacant(e) = files.entry(file) {
                e.insert(open(file).map_err(|error| Failed { error, file })?);
            }
        }
        return assemble(
            &blocks,
            elem,
            pieces,
            &files,
            &mut copier.assembly,
            sink,
            stop,
        );
    }
    for run in crate::types::pieces::runs(&shape, tensor.dtype.size(), pieces) {
        let file = pieces[run.piece].range.file;
        let failed = |error| Failed { error, file };
        let src = match files.entry(file) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(open(file).map_err(failed)?),
        };
        move_run(copier, src, run, &mut sink, stop).map_err(failed)?;
    }
    Ok(())
}

fn move_run(
    copier: &mut Copier,
    src: &File,
    run: Run,
    sink: &mut Sink<'_>,
    stop: &dyn Stop,
) -> Result<(), CopyError> {
    match sink {
        Sink::File {
            at: (dst, begin),
            dtypes: (from, to),
            report,
        } => {
            let out = *begin + run.to / from.size() * to.size();
            if from == to {
                copier.copy((src, run.from), (dst, out), run.len, stop, *report)
            } else {
                let dtypes = (*from, *to);
                copier.cast((src, run.from), (dst, out), run.len, dtypes, stop, *report)
            }
        }
        Sink::Stream { cast, feed } => copier.stream((src, run.from), run.len, *cast, stop, *feed),
    }
}

/// Where a window sits in the whole tensor.
struct Place<'a> {
    shape: &'a [u64],
    elem: u64,
    /// The tensor's row (along dimension 0) the window starts at.
    first_row: u64,
}

/// Places rows `lo..hi` (of the whole tensor) of a piece stored with `stride` into
/// `window`: each stretch along the dimension whose elements are next to each other
/// in storage read in one read (into `buffer`), then spread to where its elements go.
fn gather(
    piece: &Piece,
    stride: &[u64],
    src: &File,
    (lo, hi): (u64, u64),
    place: &Place<'_>,
    window: &mut [u8],
    buffer: &mut Vec<u8>,
) -> Result<(), CopyError> {
    let dims = piece.sizes.len();
    let elem = place.elem as usize;
    let mut out_stride = vec![1u64; dims];
    for d in (0..dims.saturating_sub(1)).rev() {
        out_stride[d] = out_stride[d + 1] * place.shape[d + 1];
    }
    // The stretch dimension: stride 1 where the piece moves (checked when read).
    let along = (0..dims)
        .rev()
        .find(|&d| piece.sizes[d] > 1 && stride[d] == 1)
        .unwrap_or(dims.saturating_sub(1));
    let (first, end) = (lo - piece.offsets[0], hi - piece.offsets[0]);
    let range = |d: usize| {
        if d == 0 {
            (first, end)
        } else {
            (0, piece.sizes[d])
        }
    };
    let (start, len) = if along == 0 {
        (first, end - first)
    } else {
        (0, piece.sizes[along])
    };
    let mut index: Vec<u64> = (0..dims).map(|d| range(d).0).collect();
    index[along] = start;
    if (0..dims).any(|d| d != along && range(d).0 >= range(d).1) || len == 0 {
        return Ok(());
    }
    buffer.resize(len as usize * elem, 0);
    loop {
        let at: u64 = index.iter().zip(stride).map(|(i, s)| i * s).sum();
        super::copy::read_exact_at(src, buffer, piece.range.offset + at * place.elem)?;
        let base = (piece.offsets[0] + index[0] - place.first_row) * out_stride[0]
            + (1..dims)
                .map(|d| (piece.offsets[d] + index[d]) * out_stride[d])
                .sum::<u64>();
        if out_stride[along] == 1 {
            let to = base as usize * elem;
            window[to..to + buffer.len()].copy_from_slice(buffer);
        } else {
            for step in 0..len as usize {
                let to = (base + step as u64 * out_stride[along]) as usize * elem;
                let from = step * elem;
                window[to..to + elem].copy_from_slice(&buffer[from..from + elem]);
            }
        }
        // The next index over every dimension but the stretch's, last fastest.
        let mut d = dims;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            if d == along {
                continue;
            }
            index[d] += 1;
            if index[d] < range(d).1 {
                break;
            }
            index[d] = range(d).0;
        }
    }
}

/// The window's bytes as written: itself, or converted into `converted` when `cast`
/// names two dtypes.
fn cast_window<'b>(
    window: &'b [u8],
    cast: Option<(DType, DType)>,
    converted: &'b mut Vec<u8>,
) -> &'b [u8] {
    match cast {
        Some((from, to)) if from != to => {
            converted.resize(window.len() / from.size() as usize * to.size() as usize, 0);
            super::cast::cast(from, to, window, converted);
            converted
        }
        _ => window,
    }
}

/// The buffers a tensor is assembled in, kept from one tensor to the next (a fresh
/// window would be zeroed first: a second pass over every byte).
#[derive(Default)]
pub struct Assembly {
    window: Vec<u8>,
    share: Vec<u8>,
    converted: Vec<u8>,
}

/// The most a writer holds to assemble a tensor: the window, a piece's share of it,
/// and the window cast to a dtype up to twice as wide.
pub const ASSEMBLY_BYTES: u64 = 4 * WINDOW as u64;

/// Runs at least this long are read straight to their place in the window (one
/// vectored read for many); shorter ones are read with their piece's share of the
/// window and spread in memory.
const MIN_SCATTER: u64 = 64;

/// Vectored reads take at most this many stretches (the kernel's IOV_MAX).
const MAX_IOVECS: usize = 1024;

/// Reads each of `runs` (from its piece's file `src`, in order and next to each other
/// there) to its place in `window`, up to [`MAX_IOVECS`] runs a read.
fn read_scattered(
    src: &File,
    runs: impl Iterator<Item = Run>,
    window: &mut [u8],
) -> Result<(), CopyError> {
    let mut runs = runs.peekable();
    let mut rest: &mut [u8] = window;
    let mut consumed = 0usize;
    while let Some(first) = runs.peek() {
        let at = first.from;
        let mut slices = Vec::with_capacity(MAX_IOVECS);
        let mut next_from = at;
        while slices.len() < MAX_IOVECS {
            let Some(run) = runs.next_if(|r| r.from == next_from) else {
                break;
            };
            let (to, n) = (run.to as usize, run.len as usize);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(to - consumed);
            let (place, tail) = tail.split_at_mut(n);
            slices.push(std::io::IoSliceMut::new(place));
            rest = tail;
            consumed = to + n;
            next_from += run.len;
        }
        crate::sys::files::read_exact_vectored_at(src, &mut slices, at).map_err(CopyError::Io)?;
    }
    Ok(())
}

/// Runs shorter than this are assembled in memory rather than copied one by one.
const LONG_RUN: u64 = 1 << 20;

/// The bytes of whole rows assembled at once (and the most a piece's share of them
/// is): small enough that the window, a piece's share and a cast stay a few MiB.
const WINDOW: usize = 4 << 20;

/// Writes a tensor (of the shape its pieces are blocks of, `elem` bytes an element)
/// a window of whole rows of dimension 0 at a time.
fn assemble(
    shape: &[u64],
    elem: u64,
    pieces: &[Piece],
    files: &HashMap<FileId, File>,
    buffers: &mut Assembly,
    mut sink: Sink<'_>,
    stop: &dyn Stop,
) -> Result<(), Failed> {
    let rows = shape.first().copied().unwrap_or(1);
    let row_bytes = shape.iter().skip(1).product::<u64>() * elem;
    let per_window = (WINDOW as u64 / row_bytes).max(1);
    let Assembly {
        window,
        share,
        converted,
    } = buffers;
    let mut row = 0;
    while row < rows {
        let end = (row + per_window).min(rows);
        let len = usize::try_from((end - row) * row_bytes).unwrap_or(usize::MAX);
        // Every byte of the window is written by its pieces (they tile the tensor:
        // checked before a save), so it is zeroed only where it grows.
        window.resize(len, 0);
        let mut window_shape = shape.to_vec();
        window_shape[0] = end - row;
        for p in pieces {
            let (first, count) = (p.offsets[0], p.sizes[0]);
            let (lo, hi) = (row.max(first), end.min(first + count));
            if lo >= hi || p.sizes.contains(&0) {
                continue;
            }
            let failed = |error| Failed {
                error,
                file: p.range.file,
            };
            if stop.stop() {
                return Err(failed(CopyError::Cancelled));
            }
            let piece_row = p.sizes.iter().skip(1).product::<u64>() * elem;
            let src = files
                .get(&p.range.file)
                .ok_or_else(|| failed(CopyError::Io(std::io::Error::other("not opened"))))?;
            if let Some(stride) = &p.stride {
                let place = Place {
                    shape,
                    elem,
                    first_row: row,
                };
                gather(p, stride, src, (lo, hi), &place, window, share).map_err(failed)?;
                continue;
            }
            // The piece's rows lo..hi, contiguous in the piece, as a block of the window.
            let mut offsets = p.offsets.to_vec();
            offsets[0] = lo - row;
            let mut sizes = p.sizes.to_vec();
            sizes[0] = hi - lo;
            let block = [Piece {
                range: crate::types::range::ByteRange {
                    file: p.range.file,
                    offset: p.range.offset + (lo - first) * piece_row,
                    len: (hi - lo) * piece_row,
                },
                offsets: offsets.into(),
                sizes: sizes.into(),
                stride: None,
            }];
            let runs = crate::types::pieces::runs(&window_shape, elem, &block);
            if *p.sizes.last().unwrap_or(&1) * elem >= MIN_SCATTER {
                read_scattered(src, runs, window).map_err(failed)?;
            } else {
                // Runs too short to read one by one: the share in one read, then spread.
                share.clear();
                share.resize(block[0].range.len as usize, 0);
                super::copy::read_exact_at(src, share, block[0].range.offset).map_err(failed)?;
                for run in runs {
                    let (to, n) = (run.to as usize, run.len as usize);
                    let from = (run.from - block[0].range.offset) as usize;
                    window[to..to + n].copy_from_slice(&share[from..from + n]);
                }
            }
        }
        let last = pieces.first().map_or(0, |p| p.range.file);
        let failed = |error| Failed { error, file: last };
        match &mut sink {
            Sink::File {
                at: (dst, begin),
                dtypes: (from, to),
                report,
            } => {
                let out = *begin + row * row_bytes / from.size() * to.size();
                let bytes = cast_window(window, Some((*from, *to)), converted);
                std::os::unix::fs::FileExt::write_all_at(*dst, bytes, out)
                    .map_err(|e| failed(CopyError::Io(e)))?;
                report(bytes.len() as u64);
            }
            Sink::Stream { cast, feed } => {
                let bytes = cast_window(window, *cast, converted);
                feed(bytes).map_err(|e| failed(CopyError::Io(e)))?;
            }
        }
        row = end;
    }
    Ok(())
}
