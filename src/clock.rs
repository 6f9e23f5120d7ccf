//! The edge's clock: the one place the Worker and the Dispatcher read time.
//! Everything below takes `now_ms` as a parameter.

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    // Date::now() is a whole number of milliseconds well below 2^53.
    worker::Date::now().as_millis() as i64
}
