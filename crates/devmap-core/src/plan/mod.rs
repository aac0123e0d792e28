//! Device-map planning: accelerate's automatic placement over a checkpoint's module
//! tree, budgets, and the checks that compare a map with them.

pub mod activation;
pub mod auto;
pub mod kv;
pub mod order;
pub mod parallel;
pub mod reserve;
pub mod view;

pub use auto::{PlanMode, PlanOptions, Planned, PlanningError, plan, warm_up};

use crate::formats::size::{SizeError, parse_size};
use crate::model::checkpoint::Checkpoint;
use crate::model::warning::Warning;
use crate::types::placement::Placement;

/// The budgets `from_pretrained` takes when `max_memory` is not given, from what
/// the machine has free (`detected`): 90% of the CPU's (transformers' `get_max_memory`
/// keeps a tenth for conversion spikes) and, balancing over a lone GPU, 90% of it.
pub fn default_budgets(detected: &[(Placement, u64)], mode: PlanMode) -> Vec<(Placement, u64)> {
    let gpus = detected
        .iter()
        .filter(|(p, b)| matches!(p, Placement::Gpu(_) | Placement::Mps) && *b > 0)
        .count();
    let ninety = |b: u64| (b as f64 * 0.9) as u64;
    let mut lone_gpu_cut = gpus == 1 && mode != PlanMode::Sequential;
    detected
        .iter()
        .map(|&(p, b)| match p {
            Placement::Cpu => (p, ninety(b)),
            Placement::Gpu(_) if lone_gpu_cut => {
                lone_gpu_cut = false;
                (p, ninety(b))
            }
            _ => (p, b),
        })
        .collect()
}

/// Why a `--max-memory` spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("`{0}` is not DEVICE=SIZE (e.g. 0=22GiB or cpu=64GiB)")]
    NotAPair(String),
    #[error("`{0}` is not a device: use a GPU index, cuda:N, mps, cpu or disk")]
    UnknownDevice(String),
    #[error(transparent)]
    Size(#[from] SizeError),
    #[error("{0} is given twice")]
    Repeated(Placement),
    #[error("give at least one device, e.g. 0=22GiB,cpu=64GiB")]
    Empty,
}

/// Parses `--max-memory 0=22GiB,1=22GiB,cpu=64GiB` (device=size pairs; GPU indexes,
/// `cuda:N`, `mps`, `cpu`, `disk`; sizes as `formats::size` reads them). A disk
/// budget is accepted as accelerate's `max_memory` accepts it: the planner, like
/// `infer_auto_device_map`, still lets disk take whatever is left, and the
/// over-budget check (`inspect --max-memory`) holds the disk total against it.
pub fn parse_max_memory(text: &str) -> Result<Vec<(Placement, u64)>, BudgetError> {
    let mut out: Vec<(Placement, u64)> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (device, size) = part
            .split_once('=')
            .ok_or_else(|| BudgetError::NotAPair(part.to_owned()))?;
        let device = device.trim();
        let placement = match device.parse::<u32>() {
            Ok(i) => Placement::Gpu(i),
            Err(_) => match Placement::parse_device(device) {
                Some(
                    p @ (Placement::Gpu(_) | Placement::Mps | Placement::Cpu | Placement::Disk),
                ) => p,
                _ => return Err(BudgetError::UnknownDevice(device.to_owned())),
            },
        };
        let bytes = parse_size(size)?;
        if out.iter().any(|(p, _)| *p == placement) {
            return Err(BudgetError::Repeated(placement));
        }
        out.push((placement, bytes));
    }
    if out.is_empty() {
        return Err(BudgetError::Empty);
    }
    Ok(out)
}

/// Devices whose placed bytes exceed their budget: `(device, placed, budget)`.
pub fn over_budget(ckpt: &Checkpoint, budgets: &[(Placement, u64)]) -> Vec<(Placement, u64, u64)> {
    ckpt.device_totals()
        .into_iter()
        .filter_map(|(p, bytes)| {
            let budget = budgets.iter().find(|(b, _)| *b == p)?.1;
            (bytes > budget).then_some((p, bytes, budget))
        })
        .collect()
}

/// The over-budget check as sentences naming the device.
pub fn budget_warnings(ckpt: &Checkpoint, budgets: &[(Placement, u64)]) -> Vec<Warning> {
    over_budget(ckpt, budgets)
        .into_iter()
        .map(|(device, bytes, budget)| Warning::OverBudget {
            device,
            bytes,
            budget,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_memory_strings() {
        assert_eq!(
            parse_max_memory("0=22GiB, 1=20GB,cpu=64GiB"),
            Ok(vec![
                (Placement::Gpu(0), 22 << 30),
                (Placement::Gpu(1), 20_000_000_000),
                (Placement::Cpu, 64 << 30)
            ])
        );
        assert_eq!(
            parse_max_memory("cuda:2=1GB"),
            Ok(vec![(Placement::Gpu(2), 1_000_000_000)])
        );
        assert_eq!(
            parse_max_memory("cpu=36MB,disk=100GB"),
            Ok(vec![
                (Placement::Cpu, 36_000_000),
                (Placement::Disk, 100_000_000_000)
            ])
        );
        assert!(parse_max_memory("tpu=1GB").is_err());
        assert!(parse_max_memory("0=1GB,0=2GB").is_err());
        assert!(parse_max_memory("0").is_err());
        assert!(parse_max_memory("").is_err());
    }
}
