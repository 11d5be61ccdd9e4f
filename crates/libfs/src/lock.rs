//! Spin locks: the hot path never sleeps in the kernel; under long contention a waiter
//! yields its core (one `sched_yield`), which only happens when another thread holds the lock.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};

fn backoff(round: &mut u32) {
    *round += 1;
    if *round < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Readers-writer spin lock. A waiting writer blocks new readers so it cannot starve.
pub struct SpinRwLock<T> {
    state: AtomicU32,
    data: UnsafeCell<T>,
}

const WRITER: u32 = 1 << 31;
const WRITER_WAITING: u32 = 1 << 30;
const READERS: u32 = WRITER_WAITING - 1;

unsafe impl<T: Send> Send for SpinRwLock<T> {}
unsafe impl<T: Send + Sync> Sync for SpinRwLock<T> {}

impl<T> SpinRwLock<T> {
    pub const fn new(value: T) -> Self {
        SpinRwLock {
            state: AtomicU32::new(0),
            data: UnsafeCell::new(value),
        }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        let mut round = 0;
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if s & (WRITER | WRITER_WAITING) == 0
                && s & READERS != READERS
                && self
                    .state
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return ReadGuard { lock: self };
            }
            backoff(&mut round);
        }
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        let mut round = 0;
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if s & (WRITER | READERS) == 0 {
                if self
                    .state
                    .compare_exchange_weak(s, WRITER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return WriteGuard { lock: self };
                }
            } else if s & WRITER_WAITING == 0 {
                self.state.fetch_or(WRITER_WAITING, Ordering::Relaxed);
            }
            backoff(&mut round);
        }
    }
}

pub struct ReadGuard<'a, T> {
    lock: &'a SpinRwLock<T>,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.state.fetch_sub(1, Ordering::Release);
    }
}

pub struct WriteGuard<'a, T> {
    lock: &'a SpinRwLock<T>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.state.store(0, Ordering::Release);
    }
}

/// Mutual-exclusion spin lock.
pub struct SpinLock<T> {
    inner: SpinRwLock<T>,
}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock {
            inner: SpinRwLock::new(value),
        }
    }
    pub fn lock(&self) -> WriteGuard<'_, T> {
        self.inner.write()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counter_is_exact_under_contention() {
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 80_000);
    }

    #[test]
    fn readers_share_and_writer_excludes() {
        let lock = SpinRwLock::new(5);
        {
            let a = lock.read();
            let b = lock.read();
            assert_eq!(*a + *b, 10);
        }
        *lock.write() = 7;
        assert_eq!(*lock.read(), 7);
    }
}
