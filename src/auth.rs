//! Bearer tokens: who may call the admin and policy routes.
//!
//! `ADMIN_TOKENS` grant every bearer route; `POLICY_TOKENS` grant the
//! business panel's routes (policy, preview, status, decisions, calls) and
//! are refused 403 `forbidden` on operator-only routes and on `GET
//! /v1/metrics`; `METRICS_TOKENS` grant `GET /v1/metrics` and nothing else
//! (403 `forbidden` everywhere else). Without a valid token the answer is
//! 401 `unauthorized`.
//!
//! Tokens are compared as SHA-256 digests with a constant-time comparison
//! against every configured token, so neither the outcome nor the position
//! of a match shows in the timing, and the presented token's length does not
//! either. A token is known afterwards only by its [`fingerprint`], which is
//! what documents record as their writer.

use callfence_core::encoding::{ct_eq, sha256_hex};

/// Shortest accepted token.
pub const MIN_TOKEN_CHARS: usize = 32;
/// Longest accepted token (configured or presented).
pub const MAX_TOKEN_CHARS: usize = 512;
/// Most tokens per variable.
pub const MAX_TOKENS: usize = 32;
/// Hex digits of a token fingerprint.
pub const FINGERPRINT_HEX: usize = 12;

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// An admin token (operator-only routes).
    AdminOnly,
    /// A policy or an admin token (the business panel's routes).
    PolicyOrAdmin,
    /// A metrics or an admin token (`GET /v1/metrics`).
    MetricsOrAdmin,
}

/// What an accepted token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// An `ADMIN_TOKENS` token.
    Admin,
    /// A `POLICY_TOKENS` token.
    Policy,
    /// A `METRICS_TOKENS` token.
    Metrics,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// What its token grants.
    pub scope: Scope,
    /// The token's [`fingerprint`].
    pub fingerprint: String,
}

/// Why a bearer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No token, a malformed header, or an unknown token: 401.
    Unauthorized,
    /// A token of another scope than the route's (a policy token on an
    /// operator-only route or on metrics, a metrics token anywhere but
    /// metrics): 403.
    Forbidden,
}

impl AuthError {
    /// Stable code: `unauthorized` or `forbidden`.
    pub fn code(self) -> &'static str {
        match self {
            AuthError::Unauthorized => "unauthorized",
            AuthError::Forbidden => "forbidden",
        }
    }
}

/// The configured tokens, kept as SHA-256 hex digests.
#[derive(Debug, Clone)]
pub struct Tokens {
    admin: Vec<String>,
    policy: Vec<String>,
    metrics: Vec<String>,
}

impl Tokens {
    /// Parses `ADMIN_TOKENS` (required) and `POLICY_TOKENS` (optional):
    /// comma-separated tokens of [`MIN_TOKEN_CHARS`] to [`MAX_TOKEN_CHARS`]
    /// visible ASCII characters, at most [`MAX_TOKENS`] each. A token in both
    /// lists is refused (its scope would be ambiguous). The error names the
    /// variables at fault.
    pub fn parse(admin: Option<&str>, policy: Option<&str>) -> Result<Tokens, Vec<&'static str>> {
        let admin_tokens = admin.and_then(parse_list).ok_or("ADMIN_TOKENS");
        let policy_tokens = policy
            .map_or(Some(Vec::new()), parse_list)
            .ok_or("POLICY_TOKENS");
        match (admin_tokens, policy_tokens) {
            (Ok(admin), Ok(policy)) if !admin.iter().any(|a| policy.contains(a)) => Ok(Tokens {
                admin,
                policy,
                metrics: Vec::new(),
            }),
            (Ok(_), Ok(_)) => Err(vec!["ADMIN_TOKENS", "POLICY_TOKENS"]),
            (admin, policy) => Err(admin.err().into_iter().chain(policy.err()).collect()),
        }
    }

    /// Adds `METRICS_TOKENS` (optional; the same rules as the others): a
    /// token also in `ADMIN_TOKENS` or `POLICY_TOKENS` is refused. On error
    /// no metrics token is added, and the error names the variable.
    pub fn add_metrics(&mut self, metrics: Option<&str>) -> Result<(), &'static str> {
        let tokens = metrics
            .map_or(Some(Vec::new()), parse_list)
            .ok_or("METRICS_TOKENS")?;
        if tokens
            .iter()
            .any(|t| self.admin.contains(t) || self.policy.contains(t))
        {
            return Err("METRICS_TOKENS");
        }
        self.metrics = tokens;
        Ok(())
    }

    /// Checks an `Authorization` header value against `access`.
    pub fn authorize(
        &self,
        authorization: Option<&str>,
        access: Access,
    ) -> Result<Caller, AuthError> {
        let token = authorization
            .and_then(bearer)
            .ok_or(AuthError::Unauthorized)?;
        let digest = sha256_hex(token.as_bytes());
        // Visit every token whatever matches, so timing says nothing.
        let matches = |list: &[String]| {
            list.iter().fold(false, |hit, known| {
                hit | ct_eq(known.as_bytes(), digest.as_bytes())
            })
        };
        let is_admin = matches(&self.admin);
        let is_policy = matches(&self.policy);
        let is_metrics = matches(&self.metrics);
        let scope = if is_admin {
            Scope::Admin
        } else if is_policy {
            Scope::Policy
        } else if is_metrics {
            Scope::Metrics
        } else {
            return Err(AuthError::Unauthorized);
        };
        let granted = matches!(
            (scope, access),
            (Scope::Admin, _)
                | (Scope::Policy, Access::PolicyOrAdmin)
                | (Scope::Metrics, Access::MetricsOrAdmin)
        );
        if !granted {
            return Err(AuthError::Forbidden);
        }
        Ok(Caller {
            scope,
            fingerprint: digest[..FINGERPRINT_HEX].to_owned(),
        })
    }
}

/// The first [`FINGERPRINT_HEX`] hex digits of the token's SHA-256: enough to
/// tell writers apart, useless to an attacker.
pub fn fingerprint(token: &str) -> String {
    sha256_hex(token.as_bytes())[..FINGERPRINT_HEX].to_owned()
}

/// True for a token of acceptable length and characters.
fn valid_token(token: &str) -> bool {
    (MIN_TOKEN_CHARS..=MAX_TOKEN_CHARS).contains(&token.len())
        && token.bytes().all(|b| b.is_ascii_graphic())
}

/// The digests of a comma-separated token list, or `None` if any entry is
/// invalid or the list is too long.
fn parse_list(csv: &str) -> Option<Vec<String>> {
    let tokens: Vec<&str> = csv.split(',').map(str::trim).collect();
    if tokens.len() > MAX_TOKENS || !tokens.iter().all(|t| valid_token(t)) {
        return None;
    }
    Some(tokens.iter().map(|t| sha256_hex(t.as_bytes())).collect())
}

/// The token of `Bearer <token>` (scheme case-insensitive).
fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim_start();
    (scheme.eq_ignore_ascii_case("bearer") && valid_token(token)).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "admin-token-0123456789abcdefghijklmnop";
    const ADMIN2: &str = "second-admin-0123456789abcdefghijklmn";
    const POLICY: &str = "policy-token-0123456789abcdefghijklmno";
    const METRICS: &str = "metrics-token-0123456789abcdefghijklmn";

    fn tokens() -> Tokens {
        let mut tokens = Tokens::parse(Some(&format!("{ADMIN}, {ADMIN2}")), Some(POLICY)).unwrap();
        tokens.add_metrics(Some(METRICS)).unwrap();
        tokens
    }

    #[test]
    fn admin_tokens_open_every_route() {
        for token in [ADMIN, ADMIN2] {
            for access in [Access::AdminOnly, Access::PolicyOrAdmin] {
                let caller = tokens()
                    .authorize(Some(&format!("Bearer {token}")), access)
                    .unwrap();
                assert_eq!(caller.scope, Scope::Admin);
                assert_eq!(caller.fingerprint, fingerprint(token));
            }
        }
    }

    #[test]
    fn policy_tokens_are_forbidden_on_operator_routes() {
        let header = format!("bearer {POLICY}");
        let caller = tokens()
            .authorize(Some(&header), Access::PolicyOrAdmin)
            .unwrap();
        assert_eq!(caller.scope, Scope::Policy);
        assert_eq!(
            tokens().authorize(Some(&header), Access::AdminOnly),
            Err(AuthError::Forbidden)
        );
    }

    #[test]
    fn metrics_tokens_read_metrics_and_nothing_else() {
        let all = [
            Access::AdminOnly,
            Access::PolicyOrAdmin,
            Access::MetricsOrAdmin,
        ];
        for access in all {
            let metrics = tokens().authorize(Some(&format!("Bearer {METRICS}")), access);
            let policy = tokens().authorize(Some(&format!("Bearer {POLICY}")), access);
            let admin = tokens().authorize(Some(&format!("Bearer {ADMIN}")), access);
            assert_eq!(admin.unwrap().scope, Scope::Admin);
            if access == Access::MetricsOrAdmin {
                assert_eq!(metrics.unwrap().scope, Scope::Metrics);
                assert_eq!(policy, Err(AuthError::Forbidden));
            } else {
                assert_eq!(metrics, Err(AuthError::Forbidden), "{access:?}");
            }
        }
    }

    #[test]
    fn metrics_tokens_follow_the_same_rules_and_never_repeat_another_scope() {
        let mut tokens = Tokens::parse(Some(ADMIN), Some(POLICY)).unwrap();
        assert_eq!(tokens.add_metrics(Some("short")), Err("METRICS_TOKENS"));
        assert_eq!(tokens.add_metrics(Some(ADMIN)), Err("METRICS_TOKENS"));
        assert_eq!(tokens.add_metrics(Some(POLICY)), Err("METRICS_TOKENS"));
        let header = format!("Bearer {METRICS}");
        assert_eq!(
            tokens.authorize(Some(&header), Access::MetricsOrAdmin),
            Err(AuthError::Unauthorized)
        );
        assert_eq!(tokens.add_metrics(None), Ok(()));
        assert_eq!(tokens.add_metrics(Some(METRICS)), Ok(()));
        assert!(tokens
            .authorize(Some(&header), Access::MetricsOrAdmin)
            .is_ok());
    }

    #[test]
    fn anything_else_is_unauthorized() {
        let wrong = format!("Bearer {}x", &ADMIN[..ADMIN.len() - 1]);
        for header in [
            None,
            Some(""),
            Some(ADMIN),
            Some("Basic abc"),
            Some(wrong.as_str()),
            Some("Bearer short"),
        ] {
            assert_eq!(
                tokens().authorize(header, Access::PolicyOrAdmin),
                Err(AuthError::Unauthorized),
                "{header:?}"
            );
        }
    }

    #[test]
    fn configuration_rules() {
        assert_eq!(Tokens::parse(None, None).unwrap_err(), ["ADMIN_TOKENS"]);
        assert_eq!(
            Tokens::parse(Some("short"), Some("x")).unwrap_err(),
            ["ADMIN_TOKENS", "POLICY_TOKENS"]
        );
        assert_eq!(
            Tokens::parse(Some(&format!("{ADMIN},")), None).unwrap_err(),
            ["ADMIN_TOKENS"]
        );
        assert_eq!(
            Tokens::parse(Some(ADMIN), Some(ADMIN)).unwrap_err(),
            ["ADMIN_TOKENS", "POLICY_TOKENS"]
        );
        let with_space = format!("{ADMIN} x");
        assert!(Tokens::parse(Some(&with_space), None).is_err());
        assert!(Tokens::parse(Some(ADMIN), None).is_ok());
    }

    #[test]
    fn fingerprints_are_short_stable_hex() {
        let fp = fingerprint(ADMIN);
        assert_eq!(fp.len(), FINGERPRINT_HEX);
        assert!(fp.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(fp, fingerprint(ADMIN2));
    }
}
