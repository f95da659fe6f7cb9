"""The kinds of training, each a Loop of its own: classifier, GAN, language model and
reinforcement learning."""
