//! The saver: plan shards, check before writing, stream bytes into place, verify,
//! commit. Reports through [`SaveEvent`]s and knows nothing of terminals.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod cast;
pub mod check_written;
mod commit;
pub mod compute;
pub mod copy;
mod error;
mod event;
pub mod execute;
pub mod fp8;
pub mod gptq;
mod hand_off;
mod job;
pub(crate) mod lookup;
pub mod lora_kernel;
pub mod mxfp4;
pub mod names;
pub mod nvfp4;
pub mod packed_int;
pub mod parts;
pub mod preflight;
pub mod quantize_fp8;
pub mod ranks;
pub mod reasons;
pub mod shards;
pub mod stage;
pub mod stitch;
mod writer;

pub use error::SaveError;
pub use event::{Reporter, SaveEvent, SaveReport};
pub use execute::Recipe;
pub use job::{SaveJob, write};
pub use reasons::{Mismatch, Refusal, Unsaveable};
pub use shards::{
    CommitCheck, DEFAULT_MAX_SHARD_SIZE, DEFAULT_MAX_SHARD_SIZE_TEXT, SaveOptions, SavePlan,
    ShardPlan, plan,
};

use crate::model::Checkpoint;

/// Plans and pre-flights a save: every refusal that can be known before writing.
pub fn prepare(ckpt: &Checkpoint, options: &SaveOptions) -> Result<SavePlan, SaveError> {
    let plan = shards::plan(ckpt, options)?;
    let problems = preflight::check(ckpt, &plan, options);
    if problems.is_empty() {
        Ok(plan)
    } else {
        Err(SaveError::Refused(problems))
    }
}
