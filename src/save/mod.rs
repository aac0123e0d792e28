//! The saver: plan shards, check before writing, stream bytes into place, verify,
//! commit. Reports through [`SaveEvent`]s and knows nothing of terminals.

pub mod cast;
mod commit;
pub mod copy;
mod error;
mod event;
mod job;
pub mod merge;
pub mod plan;
pub mod preflight;
pub mod recipe;
pub mod verify;
mod writer;

pub use error::SaveError;
pub use event::{Reporter, SaveEvent, SaveReport};
pub use job::{SaveJob, write};
pub use plan::{
    DEFAULT_MAX_SHARD_SIZE, DEFAULT_MAX_SHARD_SIZE_TEXT, SaveOptions, SavePlan, ShardPlan, plan,
};
pub use recipe::Recipe;

use crate::model::Checkpoint;

/// Plans and pre-flights a save: every refusal that can be known before writing.
pub fn prepare(ckpt: &Checkpoint, options: &SaveOptions) -> Result<SavePlan, SaveError> {
    let plan = plan::plan(ckpt, options)?;
    let problems = preflight::check(ckpt, &plan, options);
    if problems.is_empty() {
        Ok(plan)
    } else {
        Err(SaveError::Refused(problems))
    }
}
