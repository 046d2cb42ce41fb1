"""What the Ray head runs for a ToolRLJob: the job spec turned into a verl run that calls the tool pool."""
