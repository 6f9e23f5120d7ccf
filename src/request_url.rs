//! The two things the Worker reads from a request's URL, its host and one
//! query parameter, taken from the runtime's URL string as it is.
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
}
