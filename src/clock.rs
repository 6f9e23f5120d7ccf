//! The edge's clock: the one place the Worker and the Dispatcher read time.
//! Everything below takes `now_ms` as a parameter.

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    // `Date.now()`: one call into the runtime and no allocation
    // (`worker::Date::now()` builds a `Date` object and reads it with a
    // second call, and the Dispatcher reads the clock around every
    // statement). A whole number of milliseconds well below 2^53.
    worker::js_sys::Date::now() as i64
}
