"""The Lab's engines: training small models from scratch (train), recurrence beside attention (recurrent),
positions past the trained length (extrapolation), softmax against a learned sink (sinks), Performer, gated and
differential attention at one budget (variants). They use the instrument (model, analysis, corpus) and nothing below
them imports this package."""
