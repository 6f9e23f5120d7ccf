//! Token buckets kept as one stored number each: the generic cell rate
//! algorithm (GCRA). A bucket of `per_second` tokens a second and `burst`
//! tokens is, for one key, its *theoretical arrival time* (TAT): the instant
//! the bucket would be full again. A request at `now` is admitted when
//! taking one token would not push the TAT more than `burst` intervals past
//! `now`; admitting it moves the TAT one interval on. Time is a parameter.
//!
//! [`CLAIMS`] is the bucket every node's claims pass (SPEC §7.4: 10 a second,
//! burst 10).

/// A bucket's rate and depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens added each second.
    pub per_second: u32,
    /// Tokens the bucket holds when full.
    pub burst: u32,
}

/// The claims of one node (SPEC §7.4).
pub const CLAIMS: Bucket = Bucket {
    per_second: 10,
    burst: 10,
};

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// When a request would be admitted again, in milliseconds from now.
    pub retry_after_ms: i64,
}

impl Limited {
    /// The wait in whole seconds (`Retry-After`), at least 1.
    pub fn retry_after_s(self) -> u32 {
        u32::try_from(((self.retry_after_ms + 999) / 1000).max(1)).unwrap_or(u32::MAX)
    }
}

impl Bucket {
    fn interval_ms(self) -> i64 {
        1_000 / i64::from(self.per_second.max(1))
    }

    /// Admits one request at `now_ms` given the key's stored TAT (`0` when
    /// none is stored): `Ok` with the TAT to store, or [`Limited`] (store
    /// nothing).
    pub fn admit(self, tat_ms: i64, now_ms: i64) -> Result<i64, Limited> {
        let interval = self.interval_ms();
        let next = tat_ms.max(now_ms).saturating_add(interval);
        let allowed = interval.saturating_mul(i64::from(self.burst));
        if next - now_ms > allowed {
            return Err(Limited {
                retry_after_ms: next - now_ms - allowed,
            });
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_000_000_000;

    /// Admits requests at `times` in turn; the outcomes.
    fn run(times: &[i64]) -> Vec<Result<i64, Limited>> {
        let mut tat = 0;
        times
            .iter()
            .map(|t| {
                let r = CLAIMS.admit(tat, *t);
                if let Ok(next) = r {
                    tat = next;
                }
                r
            })
            .collect()
    }

    #[test]
    fn a_burst_of_ten_then_one_every_100_ms() {
        let got = run(&[NOW; 11]);
        assert!(got[..10].iter().all(Result::is_ok));
        assert_eq!(
            got[10],
            Err(Limited {
                retry_after_ms: 100
            })
        );
        assert_eq!(got[10].unwrap_err().retry_after_s(), 1);
        // One token back after 100 ms, not two.
        let got = run(&[&[NOW; 10][..], &[NOW + 100, NOW + 100]].concat());
        assert!(got[10].is_ok());
        assert!(got[11].is_err());
    }

    #[test]
    fn a_steady_ten_a_second_is_never_limited_and_an_idle_bucket_refills() {
        let steady: Vec<i64> = (0..100).map(|i| NOW + i * 100).collect();
        assert!(run(&steady).iter().all(Result::is_ok));
        let later = [&[NOW; 10][..], &[NOW + 1_000; 10]].concat();
        assert!(run(&later).iter().all(Result::is_ok));
    }

    #[test]
    fn a_clock_that_goes_back_admits_nothing_extra() {
        let mut times = vec![NOW; 10];
        times.push(NOW - 5_000);
        assert!(run(&times)[10].is_err());
    }
}
