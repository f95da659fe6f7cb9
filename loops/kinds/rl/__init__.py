"""Reinforcement learning definitions: the environment loop and its kinds, PPO and double DQN."""

from loops.kinds.rl.actor_critic import ActorCriticLoop
from loops.kinds.rl.advantages import advantages_and_returns
from loops.kinds.rl.dqn import DQNLoop
from loops.kinds.rl.environment_loop import EnvironmentLoop
from loops.kinds.rl.noise import Noise

__all__ = ["ActorCriticLoop", "DQNLoop", "EnvironmentLoop", "Noise", "advantages_and_returns"]
