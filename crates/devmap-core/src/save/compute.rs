//! The cores a save's arithmetic shares. A merge, a dequantization or a quantization
//! splits its weight among threads (`copy::write_parts_in_parallel`), and several
//! writers may run one each at once (`--jobs`, a shard a writer). Each of those threads
//! holds a permit while it works, and there are as many permits as cores: the threads
//! never outnumber the cores, and the memory they hold (a band of rows each) is a band
//! a core at most, however many writers compute at once. A thread waiting for a permit
//! holds no band yet. When one writer finishes, the next waiting threads, its or
//! another's, take its permits, so no core stands idle while a weight is left.

use std::any::Any;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};

/// The most threads one recipe splits its weight among. A shard file takes one
/// buffered write at a time (its inode's lock), and in a GPTQ/AWQ save on the AMD EPYC
/// VM the copy into the page cache was a tenth of each thread's work (`perf`, 2
/// threads), so a file's writes keep up with about ten threads, not with every core of
/// a large machine. Not measured beyond 2 cores.
pub const MOST_THREADS_A_RECIPE: u64 = 8;

/// The cores this process may run on (1 where the system cannot say), asked once.
pub fn cores() -> u64 {
    static CORES: OnceLock<u64> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// Threads a big arithmetic recipe splits its weight among: the cores, at most
/// [`MOST_THREADS_A_RECIPE`].
pub fn recipe_threads() -> u64 {
    cores().clamp(1, MOST_THREADS_A_RECIPE)
}

/// Counted permits: [`Permits::run`] waits for one, runs, and gives it back.
pub struct Permits {
    free: Mutex<u64>,
    returned: Condvar,
    total: u64,
}

impl Permits {
    pub const fn new(count: u64) -> Permits {
        Permits {
            free: Mutex::new(count),
            returned: Condvar::new(),
            total: count,
        }
    }

    /// Runs `work` holding a permit, waiting for one first. A panic in `work` gives
    /// the permit back too.
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        self.run_holding(1, work)
    }

    /// Runs `work` holding `count` permits (at most all), taken at once when that many
    /// are free: for work whose threads share memory, such as AWQ's shared read band,
    /// held while its threads come and go. (Taken together, never one by one, so two
    /// such works cannot each hold a part and wait for the rest.)
    pub fn run_holding<T>(&self, count: u64, work: impl FnOnce() -> T) -> T {
        let count = count.clamp(1, self.total.max(1));
        {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            while *free < count {
                free = self
                    .returned
                    .wait(free)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            *free -= count;
        }
        let _back = GiveBack(self, count);
        work()
    }
}

/// Gives permits back when dropped (after the work, or while a panic unwinds).
struct GiveBack<'a>(&'a Permits, u64);

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += self.1;
        // Every waiter looks: one may need several.
        self.0.returned.notify_all();
    }
}

/// The process's permits, one a core: every save in the process (the CLI's one, the
/// Python package's, tests running side by side) shares them.
pub fn permits() -> &'static Permits {
    static PERMITS: OnceLock<Permits> = OnceLock::new();
    PERMITS.get_or_init(|| Permits::new(cores()))
}

/// Working memory kept for the next thread: a kernel's band of `T` (its buffers at the
/// size its largest band needed), reused by whichever thread runs that kernel next.
/// The threads of a recipe come and go, and glibc keeps what a finished thread freed
/// in that thread's arena once a band that large has been freed (its mmap threshold
/// rises to the freed size): a GPTQ save on 2 writers peaked at 87 MiB where 2
/// threads at a time need 50. Kept bands are never freed mid-save, so they are at most
/// one a thread running at once.
static SCRATCH: Scratch = Scratch::new();

/// Runs `work` with a kept `T` (or a new one), and keeps it for the next thread.
pub fn with_scratch<T: Any + Send + Default, R>(work: impl FnOnce(&mut T) -> R) -> R {
    SCRATCH.with(work)
}

/// Frees the kept working memory (at the end of a save, and of `verify --against`'s
/// recomputation: a process that goes on, such as a Python session, does not hold a
/// band a core).
pub fn release_scratch() {
    SCRATCH.clear();
}

/// How many kept values the process holds now (bands no thread is using).
pub fn kept_scratch() -> usize {
    SCRATCH
        .kept
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .len()
}

/// Kept values of any type, one list.
struct Scratch {
    kept: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            kept: Mutex::new(Vec::new()),
        }
    }

    fn with<T: Any + Send + Default, R>(&self, work: impl FnOnce(&mut T) -> R) -> R {
        let kept = {
            let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.iter()
                .position(|b| b.is::<T>())
                .map(|at| kept.swap_remove(at))
        };
        let mut scratch: Box<T> = kept
            .and_then(|b| b.downcast::<T>().ok())
            .unwrap_or_default();
        let result = work(&mut scratch);
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(scratch);
        result
    }

    fn clear(&self) {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::{Permits, Scratch};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Scratch of a type is handed to the next user as the last one left it; another
    /// type gets its own; a cleared list starts anew.
    #[test]
    fn scratch_is_kept_for_the_next_user() {
        #[derive(Default)]
        struct Band(Vec<u8>);
        let scratch = Scratch::new();
        scratch.with(|b: &mut Band| b.0 = vec![7; 1000]);
        assert_eq!(scratch.with(|b: &mut Band| b.0.len()), 1000, "kept");
        assert_eq!(
            scratch.with(|b: &mut Vec<u32>| b.len()),
            0,
            "another kind's own"
        );
        scratch.clear();
        assert_eq!(scratch.with(|b: &mut Band| b.0.len()), 0, "released");
    }

    /// However many threads ask, no more than the permits run at once, and every one
    /// runs; the permits all come back, after a panic too.
    #[test]
    fn no_more_threads_run_than_there_are_permits() {
        for count in [1u64, 2, 3] {
            let permits = Permits::new(count);
            let (running, most, done) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
            std::thread::scope(|scope| {
                for _ in 0..12 {
                    scope.spawn(|| {
                        permits.run(|| {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(3));
                            running.fetch_sub(1, Ordering::SeqCst);
                            done.fetch_add(1, Ordering::SeqCst);
                        });
                    });
                }
            });
            assert_eq!(done.load(Ordering::SeqCst), 12);
            assert!(most.load(Ordering::SeqCst) <= count, "{count} permits");
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                permits.run(|| panic!("a failing part"))
            }));
            assert!(panicked.is_err());
            assert_eq!(*permits.free.lock().expect("lock"), count, "all given back");
        }
    }
}
