"""One run of training, in rooms by concern, each importing only the rooms before it in this list:
reporting/ what users see, safety/ the run's files and stops, placement/ where rollouts and scoring
run, plan/ the recipe checked whole into the stage plan, loop/ the run and its step."""
