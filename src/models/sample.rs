//! Choosing the next token from a model's logits: greedy, or sampled after a repetition
//! penalty, temperature, top-k, top-p and min-p, in that order (transformers' order), from a
//! seeded generator so a seed repeats its text. OpenAI's presence and frequency penalties apply
//! first, over the tokens generated so far (not the prompt's), as vLLM applies them.

use tpu_runtime::{Error, Result};

/// How the next token is chosen. The default is greedy (temperature 0).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 chooses the most likely token; above 0 divides the logits before sampling.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities add up to `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Above 1 makes tokens already in the text less likely (CTRL's penalty: positive logits
    /// divided by it, negative ones multiplied).
    pub repetition_penalty: f32,
    /// Subtracted from the logit of every token already generated (OpenAI's, in [-2, 2]).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (OpenAI's, in [-2, 2]).
    pub frequency_penalty: f32,
    /// The generator's seed.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl Sampling {
    /// Greedy choice.
    pub fn greedy() -> Sampling {
        Sampling::default()
    }

    /// An error naming the first value out of range.
    pub fn check(&self) -> Result<()> {
        let bad = |what: &str, v: f32, want: &str| {
            Err(Error::invalid_argument(
                "sampling",
                format!("{what} is {v}, expected {want}"),
            ))
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", self.temperature, "a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "a number in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "a number in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad(
                "repetition_penalty",
                self.repetition_penalty,
                "a finite number > 0",
            );
        }
        for (what, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(what, v, "a number in [-2, 2]");
            }
        }
        Ok(())
    }
}

/// Chooses tokens as a [`Sampling`] says, with its own seeded generator.
pub struct Sampler {
    opts: Sampling,
    state: u64,
    /// How many times each token was chosen (for the presence and frequency penalties).
    counts: std::collections::HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler; an error when a setting is out of range.
    pub fn new(opts: Sampling) -> Result<Sampler> {
        opts.check()?;
        Ok(Sampler {
            state: opts.seed,
            opts,
            counts: Default::default(),
        })
    }

    /// A uniform number in [0, 1) (splitmix64: small, fast and reproducible).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token from `logits` (one per vocabulary entry), given the tokens so far (the
    /// prompt's and the generated ones, for the repetition penalty); the sampler remembers its
    /// own choices for the presence and frequency penalties.
    pub fn next(&mut self, logits: &[f32], previous: &[u32]) -> Result<u32> {
        let t = self.choose(logits, previous)?;
        *self.counts.entry(t).or_default() += 1;
        Ok(t)
    }

    fn choose(&mut self, logits: &[f32], previous: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::invalid_argument(
                "sampling",
                "no logits to choose from",
            ));
        }
        let mut l = logits.to_vec();
        let (pp, fp) = (self.opts.presence_penalty, self.opts.frequency_penalty);
        if pp != 0.0 || fp != 0.0 {
            for (&t, &n) in &self.counts {
                if let Some(x) = l.get_mut(t as usize) {
                    *x -= pp + fp * n as f32;
                }
            }
        }
        let p = self.opts.repetition_penalty;
        if p != 1.0 {
            // Once per distinct token, however often it came (transformers gathers the logits
            // of the previous ids and scatters them back, so repeats are penalised once).
            let mut seen = vec![false; l.len()];
            for &t in previous {
                if let Some(x) = l.get_mut(t as usize)
                    && !std::mem::replace(&mut seen[t as usize], true)
                {
                    *x = if *x > 0.0 { *x / p } else { *x * p };
                }
            }
        }
        let argmax = |v: &[f32]| {
            v.iter()
                .enumerate()
                .fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
                    if x > bv { (i, x) } else { (bi, bv) }
                })
                .0 as u32
        };
        if self.opts.temperature == 0.0 {
            return Ok(argmax(&l));
        }
        // Candidates from the most likely down, with probabilities at the temperature.
        let mut order: Vec<usize> = (0..l.len()).filter(|&i| !l[i].is_nan()).collect();
        order.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
        if self.opts.top_k > 0 {
            order.truncate(self.opts.top_k);
        }
        let t = self.opts.temperature as f64;
        let top = l[order[0]] as f64 / t;
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| (l[i] as f64 / t - top).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if self.opts.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|&x| {
                    acc += x;
                    acc >= self.opts.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        if self.opts.min_p > 0.0 {
            let floor = probs[0] * self.opts.min_p as f64;
            let keep = probs.iter().take_while(|&&x| x >= floor).count().max(1);
            probs.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut u = self.uniform() * total;
        for (k, x) in probs.iter().enumerate() {
            if u < *x {
                return Ok(order[k] as u32);
            }
            u -= x;
        }
        Ok(order[probs.len() - 1] as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGITS: [f32; 5] = [1.0, 3.0, 2.5, -1.0, 0.0];

    fn draws(opts: Sampling, n: usize) -> Vec<u32> {
        let mut s = Sampler::new(opts).unwrap();
        (0..n).map(|_| s.next(&LOGITS, &[]).unwrap()).collect()
    }

    #[test]
    fn greedy_top_k_1_and_a_tiny_top_p_choose_the_most_likely() {
        assert_eq!(draws(Sampling::greedy(), 3), [1, 1, 1]);
        let hot = |f: fn(&mut Sampling)| {
            let mut o = Sampling {
                temperature: 1.0,
                seed: 5,
                ..Sampling::default()
            };
            f(&mut o);
            draws(o, 50)
        };
        assert!(hot(|o| o.top_k = 1).iter().all(|&t| t == 1));
        assert!(hot(|o| o.top_p = 0.01).iter().all(|&t| t == 1));
        // min_p 0.7 keeps tokens at least 0.7 as likely as the best: 1 and 2 (e^-0.5 = 0.61
        // is below, so only 1).
        assert!(hot(|o| o.min_p = 0.7).iter().all(|&t| t == 1));
        let two = hot(|o| o.top_k = 2);
        assert!(two.iter().all(|&t| t == 1 || t == 2) && two.contains(&2));
    }

    #[test]
    fn a_seed_repeats_and_draws_follow_the_softmax() {
        let opts = Sampling {
            temperature: 1.0,
            seed: 42,
            ..Sampling::default()
        };
        let a = draws(opts.clone(), 20_000);
        assert_eq!(a[..50], draws(opts.clone(), 50)[..]);
        let other = Sampling { seed: 43, ..opts };
        assert_ne!(a[..50], draws(other, 50)[..]);
        let z: f64 = LOGITS.iter().map(|&x| (x as f64).exp()).sum();
        for (t, &x) in LOGITS.iter().enumerate() {
            let want = (x as f64).exp() / z;
            let got = a.iter().filter(|&&d| d == t as u32).count() as f64 / a.len() as f64;
            assert!(
                (got - want).abs() < 0.015,
                "token {t}: {got} against {want}"
            );
        }
    }

    #[test]
    fn the_repetition_penalty_and_bad_settings() {
        let mut s = Sampler::new(Sampling {
            repetition_penalty: 2.0,
            ..Sampling::default()
        })
        .unwrap();
        // Token 1 seen: 3.0 / 2 = 1.5 falls below token 2's 2.5.
        assert_eq!(s.next(&LOGITS, &[1]).unwrap(), 2);
        // Seen three times, still divided once, as transformers does: with a penalty of 1.1,
        // 3.0 / 1.1 = 2.73 stays above 2.5 (3.0 / 1.1^3 = 2.25 would not).
        let mut s = Sampler::new(Sampling {
            repetition_penalty: 1.1,
            ..Sampling::default()
        })
        .unwrap();
        assert_eq!(s.next(&LOGITS, &[1, 1, 1]).unwrap(), 1);
        for bad in [
            Sampling {
                temperature: -1.0,
                ..Sampling::default()
            },
            Sampling {
                top_p: 0.0,
                ..Sampling::default()
            },
            Sampling {
                min_p: 1.5,
                ..Sampling::default()
            },
            Sampling {
                repetition_penalty: 0.0,
                ..Sampling::default()
            },
            Sampling {
                presence_penalty: 2.5,
                ..Sampling::default()
            },
        ] {
            assert!(Sampler::new(bad).is_err());
        }
    }

    #[test]
    fn presence_and_frequency_penalties_count_the_generated_tokens() {
        // Greedy with presence 0.4: token 1 (3.0) first, then 3.0 - 0.4 = 2.6 still beats 2.5,
        // and stays the choice; the prompt's tokens (`previous`) are not penalised.
        let mut s = Sampler::new(Sampling {
            presence_penalty: 0.4,
            ..Sampling::default()
        })
        .unwrap();
        let picks: Vec<u32> = (0..3).map(|_| s.next(&LOGITS, &[2, 2]).unwrap()).collect();
        assert_eq!(picks, [1, 1, 1]);
        // Frequency 0.3: 3.0, then 2.7 > 2.5, then 2.4 < 2.5 picks token 2, then 2.4 vs
        // 2.5 - 0.3 = 2.2 picks 1 again.
        let mut s = Sampler::new(Sampling {
            frequency_penalty: 0.3,
            ..Sampling::default()
        })
        .unwrap();
        let picks: Vec<u32> = (0..4).map(|_| s.next(&LOGITS, &[]).unwrap()).collect();
        assert_eq!(picks, [1, 1, 2, 1]);
    }
}
