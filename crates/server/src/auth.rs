//! Logins. With no users configured any login is accepted (documented in the README); with
//! at least one, CONNECT must carry a matching login and passcode.

use crate::config::User;

pub(crate) struct Users {
    users: Vec<User>,
}

impl Users {
    pub fn new(users: Vec<User>) -> Users {
        Users { users }
    }

    pub fn check(&self, login: Option<&str>, passcode: Option<&str>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let (Some(login), Some(passcode)) = (login, passcode) else {
            return false;
        };
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
