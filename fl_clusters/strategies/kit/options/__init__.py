"""Options composed into the strategies that offer them: AWCFL's mixing, MCFL's features."""
