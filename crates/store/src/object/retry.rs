//! Retries on top of the `object_store` client's own: it retries a request that fails to be
//! sent, times out, is reset or gets a 5xx answer, but not a response *body* cut off while a
//! LIST is read. [`retry_until`] repeats such an operation with exponential backoff until the
//! store's deadline has passed since its first attempt.

use std::time::{Duration, Instant};

/// Backoff before retry `attempt` (0 for the first retry): 100 ms doubling, at most 15 s.
pub fn backoff(attempt: u32) -> Duration {
    let ms = 100u64.saturating_mul(1u64 << attempt.min(20));
    Duration::from_millis(ms.min(15_000))
}

/// Whether an error of the client is worth another attempt: a transport or body error
/// (`Generic`), not an answer (missing object, failed precondition, refused credentials, ...).
pub fn retryable(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { .. })
}

/// Runs `op` until it succeeds, fails with an error not [`retryable`], or `deadline` has
/// passed since the first attempt (the last error is returned); sleeps [`backoff`] between
/// attempts, never past the deadline.
pub fn retry_until<T>(
    deadline: Duration,
    mut op: impl FnMut() -> object_store::Result<T>,
) -> object_store::Result<T> {
    let start = Instant::now();
    let mut attempt = 0;
    loop {
        match op() {
            Ok(v) => return Ok(v),
            Err(e) if !retryable(&e) => return Err(e),
            Err(e) => {
                let left = deadline.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(e);
                }
                tracing::info!("compfs: bucket request failed, retrying: {e}");
                std::thread::sleep(backoff(attempt).min(left));
                attempt += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn generic() -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: "cut".into(),
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(3), Duration::from_millis(800));
        assert_eq!(backoff(40), Duration::from_secs(15));
    }

    #[test]
    fn transport_errors_are_retried_until_the_deadline_answers_are_not() {
        let mut n = 0;
        let r = retry_until(Duration::from_secs(5), || {
            n += 1;
            if n < 3 {
                Err(generic())
            } else {
                Ok(n)
            }
        });
        assert_eq!(r.unwrap(), 3);
        let mut n = 0;
        let r: object_store::Result<()> = retry_until(Duration::from_secs(5), || {
            n += 1;
            Err(object_store::Error::NotFound {
                path: "x".into(),
                source: "gone".into(),
            })
        });
        assert!(r.is_err() && n == 1);
        let t = Instant::now();
        let r: object_store::Result<()> =
            retry_until(Duration::from_millis(250), || Err(generic()));
        assert!(r.is_err());
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }
}
