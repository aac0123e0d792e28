//! What the readers of checkpoints split across ranks give: the data files they read,
//! each with the tensors it holds whole, and the tensors stored in pieces (blocks in
//! one or more of those files; see `types::pieces`).

use std::path::{Path, PathBuf};

use super::safetensors::Header;
use crate::types::DType;
use crate::types::pieces::Piece;
use crate::types::shape::Shape;

/// A split checkpoint's tensors.
#[derive(Debug, Default)]
pub struct Split {
    /// Every data file read (one holding only pieces has no tensors in its header).
    pub files: Vec<(PathBuf, Header)>,
    /// Tensors stored in pieces; each piece's `range.file` indexes `files`.
    pub pieced: Vec<PiecedTensor>,
    /// What the checkpoint holds that is not the model's weights and was left out
    /// (`` `optimizer` (40 tensors) ``, `` `epoch` ``), for a note.
    pub left_out: Vec<String>,
}

impl Split {
    /// Every tensor's name: those stored whole, file by file, then those in pieces.
    pub fn names(&self) -> impl Iterator<Item = &str> + Clone {
        self.files
            .iter()
            .flat_map(|(_, header)| header.tensors.iter().map(|t| &*t.name))
            .chain(self.pieced.iter().map(|t| t.name.as_str()))
    }
}

/// A tensor whose blocks ranks saved apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PiecedTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Shape,
    pub pieces: Vec<Piece>,
}

/// The rank that wrote a data file, from its name: torch.distributed.checkpoint's
/// `__R_S.distcp`, transformers 5's `shard-0000K-model-….safetensors` (K counts ranks
/// from 1: torch's `HuggingFaceStorageWriter` numbers each rank's plan so), DeepSpeed's
/// `zero_pp_rank_R_mp_rank_00_….pt`.
pub fn rank_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    if name.contains("zero_pp_rank_") {
        return super::deepspeed::rank_in(name, "_optim_states.pt")
            .or_else(|| super::deepspeed::rank_in(name, "_model_states.pt"));
    }
    if let Some(rest) = name.strip_prefix("__") {
        return rest.split('_').next()?.parse().ok();
    }
    let shard: u32 = name
        .strip_prefix("shard-")?
        .split('-')
        .next()?
        .parse()
        .ok()?;
    shard.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_the_writers_file_names() {
        assert_eq!(rank_of(Path::new("/x/__3_0.distcp")), Some(3));
        assert_eq!(
            rank_of(Path::new("shard-00001-model-00002-of-00004.safetensors")),
            Some(0)
        );
        assert_eq!(
            rank_of(Path::new("shard-00000-model-00001-of-00004.safetensors")),
            None
        );
        assert_eq!(rank_of(Path::new("model-00001-of-00002.safetensors")), None);
        assert_eq!(rank_of(Path::new("__x_0.distcp")), None);
        assert_eq!(
            rank_of(Path::new("bf16_zero_pp_rank_5_mp_rank_00_optim_states.pt")),
            Some(5)
        );
    }
}
