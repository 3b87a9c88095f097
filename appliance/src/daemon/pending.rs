//! Personal access tokens prepared here until their op commits (the reply carries the
//! token, the replicated op only its hash). Session forwarding's bookkeeping is
//! `node_core::forward`.

/// Tokens prepared here whose ops have not committed yet, oldest dropped past a bound
/// (an op lost to a view change never commits).
#[derive(Default)]
pub(super) struct PendingTokens {
    tokens: std::collections::HashMap<String, String>,
    order: std::collections::VecDeque<String>,
}

impl PendingTokens {
    const MAX: usize = 1024;

    pub(super) fn insert(&mut self, hash: String, token: String) {
        if self.order.len() >= Self::MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.tokens.remove(&oldest);
            }
        }
        self.order.push_back(hash.clone());
        self.tokens.insert(hash, token);
    }

    pub(super) fn take(&mut self, hash: &str) -> Option<String> {
        let token = self.tokens.remove(hash)?;
        self.order.retain(|h| h != hash);
        Some(token)
    }
}
