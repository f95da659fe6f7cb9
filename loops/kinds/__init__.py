"""The kinds of training, each a definition (a Loop subclass): classifier, GAN, language model and
reinforcement learning."""
