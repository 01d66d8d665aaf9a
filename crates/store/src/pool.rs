//! Compression worker pool: one [`ExtentEncoder`] per worker thread, reused for every extent.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use compfs_codec::ExtentEncoder;

type Job = Box<dyn FnOnce(&mut ExtentEncoder) + Send>;

/// A fixed set of worker threads fed from one queue.
pub(crate) struct Pool {
    tx: Mutex<Option<Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) threads: usize,
}

impl Pool {
    pub(crate) fn new(threads: usize) -> std::io::Result<Pool> {
        Pool::named(threads, "compfs-zip", false)
    }

    /// A pool whose threads are called `prefix0`, `prefix1`, ...; with `idle` they run under
    /// `SCHED_IDLE` (they get a core only when nothing else wants it; they hold no locks, so
    /// starving them delays only their own work).
    pub(crate) fn named(threads: usize, prefix: &str, idle: bool) -> std::io::Result<Pool> {
        let threads = threads.max(1);
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let rx: Arc<Mutex<Receiver<Job>>> = rx.clone();
            workers.push(
                std::thread::Builder::new()
                    .name(format!("{prefix}{i}"))
                    .spawn(move || {
                        if idle {
                            set_idle_scheduling();
                        }
                        let mut enc = ExtentEncoder::new();
                        loop {
                            let job = match rx.lock() {
                                Ok(r) => r.recv(),
                                Err(_) => return,
                            };
                            match job {
                                Ok(job) => job(&mut enc),
                                Err(_) => return,
                            }
                        }
                    })?,
            );
        }
        Ok(Pool {
            tx: Mutex::new(Some(tx)),
            workers: Mutex::new(workers),
            threads,
        })
    }

    /// Queues every job and returns the channel their `(index, result)` pairs arrive on.
    pub(crate) fn submit<T, F>(&self, jobs: Vec<F>) -> Receiver<(usize, T)>
    where
        T: Send + 'static,
        F: FnOnce(&mut ExtentEncoder) -> T + Send + 'static,
    {
        let (rtx, rrx) = channel::<(usize, T)>();
        let sender = self.tx.lock().ok().and_then(|g| g.clone());
        for (i, f) in jobs.into_iter().enumerate() {
            let rtx = rtx.clone();
            let job: Job = Box::new(move |enc| {
                let _ = rtx.send((i, f(enc)));
            });
            let leftover = match &sender {
                Some(s) => s.send(job).err().map(|e| e.0),
                None => Some(job),
            };
            if let Some(job) = leftover {
                job(&mut ExtentEncoder::new());
            }
        }
        drop(rtx);
        rrx
    }

    pub(crate) fn shutdown(&self) {
        if let Ok(mut g) = self.tx.lock() {
            g.take();
        }
        let ws = match self.workers.lock() {
            Ok(mut w) => std::mem::take(&mut *w),
            Err(_) => return,
        };
        for w in ws {
            let _ = w.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Puts the calling thread under `SCHED_IDLE` (Linux applies `sched_setscheduler(0, ..)` to the
/// calling thread). A failure is logged: the work still runs, at normal priority.
pub(crate) fn set_idle_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param; pid 0 names the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r != 0 {
        tracing::warn!(
            "compfs: SCHED_IDLE refused ({}); background work runs at normal priority",
            std::io::Error::last_os_error()
        );
    }
}

/// Lowers the calling thread's nice value to `nice` (Linux: per thread).
pub(crate) fn set_nice(nice: i32) {
    // SAFETY: plain syscall; gettid names the calling thread.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if r != 0 {
        tracing::warn!(
            "compfs: setpriority({nice}) refused ({})",
            std::io::Error::last_os_error()
        );
    }
}
