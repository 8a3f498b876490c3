//! A conversation's keys across turns on the cached path (DESIGN §3 Paths, "KV reuse"): a turn
//! whose prompt starts with the previous turn's whole prompt keeps every stage's keys for the
//! positions it shares with what that turn fed, and prefills only the rest. What the stages then
//! hold is what replaying the conversation's recorded passes from empty caches gives, which is how
//! Verify recomputes such a turn.

use daisy_model::{Stage, StageCache};

/// What every stage holds after the turns of one conversation, and how to rebuild it.
pub struct Conversation {
    /// The last turn's prompt: a turn continues the conversation only if its prompt starts with it.
    prompt: Vec<u32>,
    /// The ids whose keys every stage holds, by position.
    held: Vec<u32>,
    /// The passes that rebuild `held` from empty caches, their first positions increasing.
    passes: Vec<(usize, Vec<u32>)>,
    /// The head stage's own keys.
    cache: StageCache,
    /// The turn that wrote the stages' keys last.
    turn: u64,
}

impl Conversation {
    /// Nothing held yet (turn 0 continues nothing: [`Conversation::kept`] is 0 until a turn is
    /// recorded).
    pub fn new(head: &Stage) -> Self {
        Self {
            prompt: Vec::new(),
            held: Vec::new(),
            passes: Vec::new(),
            cache: head.new_cache(),
            turn: 0,
        }
    }

    /// How many leading positions of `prompt` the stages hold already: when `prompt` starts with the
    /// last turn's prompt, the positions it shares with what that turn fed (at most all but the
    /// last, which must be computed to give the next token); otherwise 0.
    pub fn kept(&self, prompt: &[u32]) -> usize {
        if self.prompt.is_empty() || !prompt.starts_with(&self.prompt) {
            return 0;
        }
        let shared = prompt
            .iter()
            .zip(&self.held)
            .take_while(|(a, b)| a == b)
            .count();
        shared.min(prompt.len() - 1)
    }

    /// The turn whose keys the stages hold.
    pub fn turn(&self) -> u64 {
        self.turn
    }

    /// The passes that rebuild the first `kept` positions from empty caches.
    pub fn history(&self, kept: usize) -> Vec<(usize, Vec<u32>)> {
        if kept == 0 {
            return Vec::new();
        }
        self.passes
            .iter()
            .filter(|(pos0, _)| *pos0 < kept)
            .cloned()
            .collect()
    }

    /// The head stage's keys, for the next turn to continue.
    pub fn cache_mut(&mut self) -> &mut StageCache {
        &mut self.cache
    }

    /// After turn `turn` with `prompt` continued `kept` positions and ran `passes`.
    pub fn record(&mut self, turn: u64, prompt: &[u32], kept: usize, passes: &[(usize, Vec<u32>)]) {
        let mut all = self.history(kept);
        all.extend(passes.iter().cloned());
        self.passes.clear();
        self.held.clear();
        for (pos0, ids) in all {
            // A pass at a position supersedes every earlier pass at or after it.
            self.passes.retain(|(p, _)| *p < pos0);
            self.held.truncate(pos0);
            self.held.extend_from_slice(&ids);
            self.passes.push((pos0, ids));
        }
        self.prompt = prompt.to_vec();
        self.turn = turn;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation(prompt: &[u32], passes: &[(usize, Vec<u32>)]) -> Conversation {
        let mut c = Conversation {
            prompt: Vec::new(),
            held: Vec::new(),
            passes: Vec::new(),
            cache: StageCache::default(),
            turn: 0,
        };
        c.record(1, prompt, 0, passes);
        c
    }

    #[test]
    fn a_turn_extending_the_last_keeps_what_they_share() {
        // Prompt 1 2 3, generated 4 5 (5 never fed), a rejected draft 9 at position 4.
        let c = conversation(
            &[1, 2, 3],
            &[(0, vec![1, 2, 3]), (3, vec![4]), (4, vec![9])],
        );
        assert_eq!(c.held, vec![1, 2, 3, 4, 9]);
        assert_eq!(c.kept(&[1, 2, 3, 4, 5, 6]), 4);
        assert_eq!(
            c.kept(&[1, 2, 3, 4]),
            3,
            "the last position is always computed"
        );
        assert_eq!(
            c.kept(&[1, 2, 7, 4, 5]),
            0,
            "not the last prompt's extension"
        );
        assert_eq!(c.kept(&[1, 2]), 0);
        assert_eq!(c.history(4), vec![(0, vec![1, 2, 3]), (3, vec![4])]);
        assert_eq!(c.history(0), Vec::<(usize, Vec<u32>)>::new());
    }

    #[test]
    fn a_recorded_turn_supersedes_what_it_overwrote() {
        let mut c = conversation(
            &[1, 2, 3],
            &[(0, vec![1, 2, 3]), (3, vec![4]), (4, vec![5])],
        );
        c.record(2, &[1, 2, 3, 4, 6, 7], 4, &[(4, vec![6, 7]), (6, vec![8])]);
        assert_eq!(c.held, vec![1, 2, 3, 4, 6, 7, 8]);
        assert_eq!(
            c.passes,
            vec![
                (0, vec![1, 2, 3]),
                (3, vec![4]),
                (4, vec![6, 7]),
                (6, vec![8])
            ]
        );
        assert_eq!(c.turn(), 2);
    }
}
