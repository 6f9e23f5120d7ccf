//! The things the Worker reads from a request's URL, its host, one query
//! parameter and a path segment's text, taken from the runtime's URL
//! string as it is.
//!
//! The runtime hands every request a URL it has already parsed and
//! serialised (WHATWG), so nothing here re-parses it. `worker::Request::url`
//! would run it through the `url` crate again, which with its IDNA and host
//! parsing is about 30 KB of the wasm for these two reads.

/// The value of the first query parameter named `name`, decoded as
/// `application/x-www-form-urlencoded` (`+` is a space, `%XX` a byte).
pub fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

/// A path segment with its `%XX` escapes decoded (`+` stays a plus, as in
/// any path). `None` when an escape is malformed or the bytes are not
/// UTF-8.
pub fn path_segment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The host of an absolute URL (`scheme://[userinfo@]host[:port]/...`),
/// without its port; an IPv6 host keeps its brackets. `None` for a URL
/// without one.
pub fn host(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.find(['/', '?', '#']).map_or(rest, |end| &rest[..end]);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if host_port.starts_with('[') {
        host_port.find(']').map(|end| &host_port[..=end])?
    } else {
        host_port.split_once(':').map_or(host_port, |(h, _)| h)
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_parameter_of_that_name_decoded() {
        let url = "https://edge.example/v1/decisions?limit=5&call_session_id=a%2Bb+c&limit=9";
        assert_eq!(query_param(url, "limit").as_deref(), Some("5"));
        assert_eq!(
            query_param(url, "call_session_id").as_deref(),
            Some("a+b c")
        );
        assert_eq!(query_param(url, "revision"), None);
        assert_eq!(
            query_param("https://edge.example/v1/policy", "revision"),
            None
        );
        assert_eq!(
            query_param("https://e.example/?revision=2#x=1", "revision").as_deref(),
            Some("2")
        );
        assert_eq!(
            query_param("https://e.example/?revision=", "revision").as_deref(),
            Some("")
        );
    }

    #[test]
    fn the_host_without_port_or_userinfo() {
        assert_eq!(host("https://edge.example/v1/fence"), Some("edge.example"));
        assert_eq!(
            host("http://127.0.0.1:8787/v1/fence?x=1"),
            Some("127.0.0.1")
        );
        assert_eq!(
            host("https://user:pw@edge.example:443"),
            Some("edge.example")
        );
        assert_eq!(host("http://[::1]:8787/"), Some("[::1]"));
        assert_eq!(host("/v1/fence"), None);
        assert_eq!(host("https:///v1"), None);
    }

    #[test]
    fn a_path_segment_is_percent_decoded_and_a_bad_escape_is_none() {
        assert_eq!(path_segment("v3%3Aabc-1").as_deref(), Some("v3:abc-1"));
        assert_eq!(path_segment("v3:abc+1").as_deref(), Some("v3:abc+1"));
        assert_eq!(path_segment("a%2Fb").as_deref(), Some("a/b"));
        for bad in ["%", "%3", "%zz", "%ff", "%+1"] {
            assert_eq!(path_segment(bad), None, "{bad}");
        }
    }
}
