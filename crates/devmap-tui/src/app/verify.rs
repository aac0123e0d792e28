//! `v` on a finished save: the runtime reads the save back on a thread and compares
//! every tensor with its source (`devmap verify --against`); the App keeps its
//! progress and result for the save panel.

use std::sync::Arc;

use super::{App, Effect, Outcome, Tone, VerifyProgress};
use devmap_core::verify::VerifyReport;

impl App {
    pub fn verify_running(&self) -> bool {
        self.save
            .as_ref()
            .and_then(|s| s.verify.as_ref())
            .is_some_and(|v| v.outcome.is_none())
    }

    pub(super) fn start_verify(&mut self) -> Vec<Effect> {
        let Some(save) = &mut self.save else {
            self.say("v verifies a finished save: save first (s)", Tone::Info);
            return Vec::new();
        };
        let Some(Outcome::Done(report)) = &save.outcome else {
            let why = if save.running() {
                "v verifies the save once it is done"
            } else {
                "only a finished save can be verified"
            };
            self.say(why, Tone::Info);
            return Vec::new();
        };
        if save.verify.as_ref().is_some_and(|v| v.outcome.is_none()) {
            return Vec::new();
        }
        let out = report.out.clone();
        save.verify = Some(VerifyProgress {
            read: 0,
            total: 0,
            outcome: None,
        });
        let plan = save.plan.clone();
        self.say_while_running(format!(
            "verifying {}: reading it back and comparing with the source… (Esc stops)",
            out.display()
        ));
        vec![Effect::StartVerify {
            ckpt: Arc::clone(&self.ckpt),
            plan,
            out,
        }]
    }

    pub(super) fn on_verify_progress(&mut self, read: u64, total: u64) {
        if let Some(v) = self.save.as_mut().and_then(|s| s.verify.as_mut()) {
            v.read = read;
            v.total = total;
        }
    }

    pub(super) fn on_verified(&mut self, result: Result<VerifyReport, String>) {
        let Some(v) = self.save.as_mut().and_then(|s| s.verify.as_mut()) else {
            return;
        };
        v.read = v.total;
        let (text, tone) = match &result {
            Ok(r) if r.differences() == 0 => (
                format!(
                    "verified: {} their source{}, no differences",
                    if r.compared == 1 {
                        "the one tensor equals".to_owned()
                    } else {
                        format!("all {} tensors equal", r.compared)
                    },
                    r.coverage
                        .architecture
                        .as_ref()
                        .map_or(String::new(), |a| format!(", as {a} expects"))
                ),
                Tone::Good,
            ),
            Ok(r) => (
                format!(
                    "verify found {}; devmap verify {} --against … lists them all",
                    devmap_core::text::count(r.differences(), "difference", "differences"),
                    r.out.display()
                ),
                Tone::Bad,
            ),
            Err(why) => (format!("could not verify: {why}"), Tone::Bad),
        };
        v.outcome = Some(result);
        self.say(text, tone);
    }
}
