"""Reinforcement learning on the Loop: the environment loop and its kinds, PPO and double DQN."""

from loops.rl.actor_critic import ActorCriticLoop
from loops.rl.advantages import advantages_and_returns
from loops.rl.dqn import DQNLoop
from loops.rl.environment_loop import EnvironmentLoop
from loops.rl.noise import Noise

__all__ = ["ActorCriticLoop", "DQNLoop", "EnvironmentLoop", "Noise", "advantages_and_returns"]
