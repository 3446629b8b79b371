"""One run of training, in rooms by concern (each imports only the rooms listed after it):
loop/ the run and its step, placement/ where rollouts and scoring run, safety/ the run's files and
stops, reporting/ what users see."""
