"""Node kinds (rollout, reward, logprob, advantage, train) and the pure math they run."""
