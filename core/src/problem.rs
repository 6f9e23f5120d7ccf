//! Validation findings: where a document is wrong and how.

use serde::Serialize;

/// One finding of a document validator: a JSON-pointer-like `path`
/// (`/nodes/M1/origin_url`) and a human sentence saying what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Where in the document, as a JSON pointer (`""` is the whole document).
    pub path: String,
    /// What is wrong there, in a short sentence.
    pub problem: String,
}

/// Collects findings while a validator walks a document.
#[derive(Debug, Default)]
pub struct Problems(Vec<Problem>);

impl Problems {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one finding.
    pub fn push(&mut self, path: impl Into<String>, problem: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            problem: problem.into(),
        });
    }

    /// True when nothing was found.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `Ok(value)` when nothing was found, else every finding.
    pub fn into_result<T>(self, value: T) -> Result<T, Vec<Problem>> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self.0)
        }
    }
}

/// Escapes one JSON-pointer segment (RFC 6901: `~` → `~0`, `/` → `~1`).
pub fn pointer_segment(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_segments_escape_tilde_before_slash() {
        assert_eq!(pointer_segment("M1"), "M1");
        assert_eq!(pointer_segment("a/b"), "a~1b");
        assert_eq!(pointer_segment("a~b"), "a~0b");
        // `~1` in a key is a tilde and a one, not an escaped slash.
        assert_eq!(pointer_segment("~1"), "~01");
        assert_eq!(pointer_segment("/~"), "~1~0");
    }

    #[test]
    fn findings_are_kept_in_order_and_only_an_empty_walk_succeeds() {
        let problems = Problems::new();
        assert!(problems.is_empty());
        assert_eq!(problems.into_result(7), Ok(7));

        let mut problems = Problems::new();
        problems.push("/nodes/M1/role", "must be stable or candidate");
        problems.push("", "not an object");
        assert!(!problems.is_empty());
        assert_eq!(
            problems.into_result(()),
            Err(vec![
                Problem {
                    path: "/nodes/M1/role".into(),
                    problem: "must be stable or candidate".into()
                },
                Problem {
                    path: "".into(),
                    problem: "not an object".into()
                },
            ])
        );
    }
}
