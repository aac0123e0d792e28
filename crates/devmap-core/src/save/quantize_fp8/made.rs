//! Tile scales made by one of a weight's two recipes, kept for the other: the values
//! then skip the tiles' maxima, and the scales (`weight_scale_inv`) are written without
//! reading the weight again. (A shard lays the F32 scales out before the F8 values,
//! so the scales' recipe usually runs first.)

use std::collections::VecDeque;
use std::sync::Mutex;

use super::Fp8Input;

/// The weight a grid belongs to: its file (device, inode), byte range, source dtype
/// and tile.
type Key = ((u64, u64), u64, u64, crate::types::DType, (u64, u64));

/// Grids kept at most: each is taken by the scales recipe of its weight, so only
/// an interrupted save leaves one behind.
const KEPT: usize = 64;

static KEPT_GRIDS: Mutex<VecDeque<(Key, Vec<f32>)>> = Mutex::new(VecDeque::new());

fn key(input: Fp8Input<'_>) -> Option<Key> {
    let l = input.layout;
    let file = crate::sys::file_identity(input.weight.0)?;
    Some((
        file,
        input.weight.1.offset,
        input.weight.1.len,
        l.from,
        l.block,
    ))
}

/// A weight's tile scales, filled band by band (by several threads).
pub(super) struct Grid {
    key: Key,
    tiles: usize,
    scales: Mutex<Vec<f32>>,
}

impl Grid {
    /// A grid to record while `input` is made, unless its scales are `known`
    /// already (or the file cannot be told apart from others).
    pub(super) fn unless_known(input: Fp8Input<'_>, known: Option<&[f32]>) -> Option<Grid> {
        if known.is_some() {
            return None;
        }
        let (rows, cols) = input.layout.grid();
        Some(Grid {
            key: key(input)?,
            tiles: cols as usize,
            scales: Mutex::new(vec![f32::NAN; (rows * cols) as usize]),
        })
    }

    pub(super) fn record(&self, band: u64, scales: &[f32]) {
        if let Ok(mut all) = self.scales.lock() {
            let at = band as usize * self.tiles;
            all[at..at + scales.len()].copy_from_slice(scales);
        }
    }
}

/// Keeps a grid whose every band was recorded (the values were written whole).
pub(super) fn keep(input: Fp8Input<'_>, grid: Option<Grid>) {
    let Some(grid) = grid else { return };
    let Ok(scales) = grid.scales.into_inner() else {
        return;
    };
    if scales.iter().any(|s| s.is_nan()) || key(input) != Some(grid.key) {
        return;
    }
    if let Ok(mut kept) = KEPT_GRIDS.lock() {
        kept.retain(|(k, _)| *k != grid.key);
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((grid.key, scales));
    }
}

/// The grid kept for the weight whose scales `input` makes, taken out.
pub(super) fn take(input: Fp8Input<'_>) -> Option<Vec<f32>> {
    let key = key(input)?;
    let mut kept = KEPT_GRIDS.lock().ok()?;
    let at = kept.iter().position(|(k, _)| *k == key)?;
    kept.remove(at).map(|(_, scales)| scales)
}
