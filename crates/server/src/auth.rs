//! Logins. With no users configured any login is accepted (documented in the README); with
//! at least one, CONNECT must carry a matching login and passcode.

use crate::config::User;

pub(crate) struct Users {
    users: Vec<User>,
    /// The login this broker's own network bridges use on its listener: random per start,
    /// never written anywhere.
    internal: (String, String),
}

/// The login of the internal credential.
const INTERNAL_LOGIN: &str = "haven-bridge";

impl Users {
    pub fn new(users: Vec<User>) -> Users {
        Users {
            users,
            internal: (INTERNAL_LOGIN.to_string(), random_token()),
        }
    }

    /// What this broker's own bridges log in with.
    pub fn internal(&self) -> (String, String) {
        self.internal.clone()
    }

    pub fn check(&self, login: Option<&str>, passcode: Option<&str>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let (Some(login), Some(passcode)) = (login, passcode) else {
            return false;
        };
        if login == self.internal.0
            && constant_time_eq(self.internal.1.as_bytes(), passcode.as_bytes())
        {
            return true;
        }
        self.users.iter().any(|u| {
            u.login == login && constant_time_eq(u.passcode.as_bytes(), passcode.as_bytes())
        })
    }
}

/// Compares without an early exit, so response time does not reveal how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 128 random bits from the kernel, in hex. Without them (no /dev/urandom) the internal login
/// is disabled by an impossible passcode: bridges then need the broker to accept any login.
fn random_token() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
        Ok(()) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        Err(e) => {
            tracing::warn!("no random source for the bridges' login ({e}); bridges need a broker without users");
            "\u{0}unusable".to_string()
        }
    }
}
