"""The kinds of training, each a definition (a Loop subclass): classifier, GAN, language model,
reinforcement learning, and the recommenders' retrieval and rating."""
