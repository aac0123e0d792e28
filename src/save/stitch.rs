//! A tensor stored in pieces (a training run's ranks each saved a block of it) written
//! whole: each piece's runs — the stretches contiguous in the whole tensor too, see
//! `types::pieces` — copied into place in the whole tensor's order, with
//! `copy_file_range` where the kernel can, or cast through the copier's fixed buffer.
//! A tensor split along its first dimension is one run per piece; split along a later
//! one, a run per row of the piece. Memory stays the copier's buffer, whatever the
//! tensor's size or the number of pieces.

use std::collections::HashMap;
use std::fs::File;

use super::copy::{Copier, CopyError, Stop};
use crate::model::checkpoint::{Checkpoint, TensorId};
use crate::types::dtype::DType;
use crate::types::pieces::Run;
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
