//! Values derived from a checkpoint's names, dtypes, shapes, ties and config (the
//! module tree, the plan's inputs), made once and shared by the copies map edits make.

use super::Checkpoint;

/// See [`Checkpoint::derived`]: a few values by (type, key), the oldest dropped first.
#[derive(Default)]
pub(super) struct Derived {
    values: Vec<(u64, std::sync::Arc<dyn std::any::Any + Send + Sync>)>,
}

impl Derived {
    /// Values kept at once (a plan tree of a 100k-tensor model is ~20 MB).
    const KEPT: usize = 4;

    fn find<T: std::any::Any + Send + Sync>(&self, key: u64) -> Option<std::sync::Arc<T>> {
        self.values
            .iter()
            .filter(|(k, _)| *k == key)
            .find_map(|(_, v)| v.clone().downcast::<T>().ok())
    }

    fn keep(&mut self, key: u64, value: std::sync::Arc<dyn std::any::Any + Send + Sync>) {
        if self.values.len() >= Self::KEPT {
            self.values.remove(0);
        }
        self.values.push((key, value));
    }
}

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Derived({} values)", self.values.len())
    }
}

impl Checkpoint {
    /// What `make` derives from this checkpoint's names, dtypes, shapes, ties and
    /// config, made once per `key` and shared by the copies map edits make (see the
    /// field). `T` and `key` together name it: a layer uses its own types.
    pub fn derived<T: std::any::Any + Send + Sync>(
        &self,
        key: u64,
        make: impl FnOnce() -> T,
    ) -> std::sync::Arc<T> {
        let found = self.derived.lock().ok().and_then(|d| d.find::<T>(key));
        if let Some(value) = found {
            return value;
        }
        // Made outside the lock: two threads may both make it; the first kept wins.
        let value = std::sync::Arc::new(make());
        if let Ok(mut d) = self.derived.lock() {
            if let Some(kept) = d.find::<T>(key) {
                return kept;
            }
            d.keep(key, value.clone());
        }
        value
    }
}
