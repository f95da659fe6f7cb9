"""The kinds of training, each a definition (a Loop subclass): classifier, click-through, GAN,
language model, reinforcement learning, and the recommenders' retrieval and rating; `library/`
holds what they compute with beyond the core."""
